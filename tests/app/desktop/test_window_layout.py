"""The window on a small desktop and with the load generator open: nothing is crushed, cut or
overlapping (issue: plots crushed to 15 px, a window that refused to be under 1106x721)."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect

from kvscope.app.desktop.blockmap.maps_over_plots import MAP_MIN_PX
from kvscope.app.desktop.blockmap.time_plots import ROW_MIN_PX
from kvscope.app.desktop.chat.chat_header import TITLE_MIN_PX

SMALL = (1024, 700)  # a 1024x768 screen less a panel and the title bar
DEFAULT = (1400, 860)


def _settle(qtbot, window, size, load_panel_open):
    window.loadgen_toggle.setChecked(load_panel_open)
    qtbot.wait(50)  # let the splitters and pyqtgraph's layout settle

    # A busy machine may deliver the layout's new minimum after the first resize: ask again
    # until the window takes the size (a minimum really above it still fails, after 5 s).
    def resized() -> bool:
        window.resize(*size)
        return window.size().toTuple() == size

    qtbot.waitUntil(resized, timeout=5_000)
    qtbot.wait(50)


def _plot_rects(window):
    plots = window.blockmap.plots
    shown = [p for p in plots.plots if p.isVisible()]
    return [plots.mapFromScene(p.sceneBoundingRect()).boundingRect() for p in shown]


def test_the_window_fits_a_1024x700_screen_with_the_load_panel_closed_and_open(make_window, qtbot):
    window = make_window()
    qtbot.waitUntil(lambda: window.status.model_label.text() != "")
    for shown in (False, True):
        _settle(qtbot, window, SMALL, shown)
        hint = window.minimumSizeHint()
        assert hint.width() <= SMALL[0] and hint.height() <= SMALL[1], (shown, hint)
        assert window.size().toTuple() == SMALL
        # The long model line is elided, not what sets the window's width.
        assert window.status.model_label.is_elided()


def test_maps_then_plots_keep_their_height_when_the_load_panel_opens(make_window, qtbot):
    window = make_window()
    _settle(qtbot, window, DEFAULT, False)
    heights = [r.height() for r in _plot_rects(window)]
    assert len(heights) == 6 and min(heights) >= ROW_MIN_PX, heights
    _settle(qtbot, window, DEFAULT, True)
    assert window.map_column.loadgen_scroll.isVisible() and window.loadgen_panel.start.isVisible()
    # The open pane takes a row of plots, not the maps' height.
    assert window.blockmap.paged_map.height() >= MAP_MIN_PX, window.blockmap.paged_map.height()
    heights = [r.height() for r in _plot_rects(window)]
    assert len(heights) >= 3 and min(heights) >= ROW_MIN_PX, heights
    # The panel's pane is in the map column, below the map, not on top of it.
    section = window.map_column.loadgen_section.geometry()
    assert window.blockmap.geometry().bottom() < section.top()  # the handle between
    # Closing gives the room back to the map.
    _settle(qtbot, window, DEFAULT, False)
    assert window.map_column.loadgen_section.height() == window.loadgen_toggle.height()
    assert window.blockmap.height() > window.map_column.height() - 2 * section.height()


def test_at_1024x700_the_status_bar_shows_and_plot_titles_do_not_overlap(make_window, qtbot):
    window = make_window()
    for shown in (False, True):
        _settle(qtbot, window, SMALL, shown)
        status = window.statusBar().geometry()
        assert window.rect().contains(status), (shown, status)
        assert status.height() >= window.status.state_label.sizeHint().height()
        titles = [p.titleLabel for p in window.blockmap.plots.plots]
        rects = [QRect(t.mapRectToScene(t.itemRect()).toAlignedRect()) for t in titles]
        for i, a in enumerate(rects):
            assert titles[i].text_fits(), titles[i].text
            for b in rects[i + 1 :]:
                assert not a.intersects(b), (shown, a, b)


def test_at_1024x700_with_the_load_panel_open_the_maps_come_before_the_plots(make_window, qtbot):
    # The issue: both maps shrank to ~40 px strips while two rows of plots kept their height.
    window = make_window()
    _settle(qtbot, window, SMALL, True)
    for view in (window.blockmap.paged_map, window.blockmap.shadow_map):
        assert view.height() >= MAP_MIN_PX, view.height()
    heights = [r.height() for r in _plot_rects(window)]
    assert len(heights) >= 3 and min(heights) >= ROW_MIN_PX, heights  # one row at least
    # The chat's title keeps room to say which chat is open.
    assert window.chat.title.width() >= TITLE_MIN_PX, window.chat.title.width()
    _settle(qtbot, window, DEFAULT, False)
    assert len(_plot_rects(window)) == 6  # a taller window brings the second row back


def test_the_load_panel_learns_the_engine_it_drives(make_window):
    # Its lengths are capped by this engine's context and its preemption preset is sized to
    # this pool, so it must hear of every engine the window gets.
    window = make_window(max_model_len=256)
    panel = window.loadgen_panel
    assert panel.preset.isEnabled()
    assert panel.prompt.high.maximum() <= window.engine_info.max_seq_len


def test_the_chat_chips_and_the_state_key_never_overlap(make_window, qtbot):
    from hand_snapshots import small_pool

    window = make_window()
    window.set_map_paused(True)  # the live pool would replace the chips fed here
    panel = window.blockmap
    title = "What are common misconceptions about volcanoes?"
    panel.set_group_labels({"conv-1": title})
    panel.update_view(small_pool(), None, {}, None)
    legend, key = panel.legend, panel.key
    for size in (SMALL, DEFAULT, (1600, 900)):
        _settle(qtbot, window, size, False)
        chips = legend.geometry().translated(legend.parentWidget().mapTo(window, QPoint()))
        states = key.geometry().translated(key.parentWidget().mapTo(window, QPoint()))
        assert not chips.intersects(states), (size, chips, states)
        assert key.width() >= key.minimumSizeHint().width(), size  # no state words cut off
        viewport = legend.viewport().rect()
        for i in range(legend.count()):  # a short window may scroll a row, never cut a chip
            chip = legend.visualItemRect(legend.item(i))
            assert 0 <= chip.left() and chip.right() <= viewport.right(), (size, i, chip)
        if size == DEFAULT:
            first = legend.item(0)
            assert legend.visualItemRect(first).width() >= 200  # ~30 characters, not 5
            assert title in first.toolTip()  # the whole title, however much is elided
            # Three chips fit one row: no empty second row under the maps.
            assert legend.height() < 2 * legend.visualItemRect(first).height()
            assert key.columns == 3
        if size == SMALL:
            assert key.columns == 2  # the short words keep the key to three rows


def test_the_load_panel_is_two_short_columns_when_wide_and_one_when_narrow(make_window, qtbot):
    window = make_window()
    panel = window.loadgen_panel
    _settle(qtbot, window, DEFAULT, True)
    assert panel.prompt.y() == panel.users.y()  # side by side, so the maps keep their height
    assert panel.start.y() == panel.stop.y()
    # Not crushed (the issue: 15 px). 70, not the 75 this once asked: the captions now show all
    # their lines (blockmap/caption_label.py), one more where the figures wrap, and the load
    # panel's limit line wraps with its numbers; measured 74-103 px by the other tests' settings.
    assert window.blockmap.paged_map.height() >= 70, window.blockmap.paged_map.height()
    _settle(qtbot, window, SMALL, True)
    assert panel.prompt.y() > panel.preset.y()  # stacked: side by side they would be cut off
    viewport = window.map_column.loadgen_scroll.viewport()
    assert panel.width() <= viewport.width()
    assert panel.output.geometry().right() <= panel.width()


def test_the_first_size_fits_the_screen_it_opens_on():
    from kvscope.app.desktop.window_geometry import initial_size

    assert initial_size(QRect(0, 0, 1920, 1050)) == DEFAULT
    # A 1024x768 screen less a panel: the window opens inside it, not 1400 wide and cut off.
    assert initial_size(QRect(0, 0, 1024, 700)) == SMALL


def test_a_narrow_window_gives_the_chat_column_room_to_read():
    from kvscope.app.desktop.window_geometry import first_sizes

    # At 1024 px the list gives up its spare width; the map keeps its minimum.
    assert first_sizes(1024, 131, 524) == [131, 369, 524]
    assert first_sizes(1400, 131, 524) == [190, 447, 763]  # 37% of the rest, as before
    # Where the map's minimum leaves less than the share, the share wins (never below it).
    assert first_sizes(1000, 131, 800)[1] == int((1000 - 131) * 0.37)


def test_the_first_layout_at_1024_px_keeps_the_map_whole(make_window, qtbot):
    window = make_window()
    _settle(qtbot, window, SMALL, False)
    window.splitter.setSizes(window._first_sizes())
    qtbot.wait(50)
    listed, chat, shown_map = window.splitter.sizes()
    assert chat >= 360, window.splitter.sizes()  # was 282: the chat's title elided to "Na…"
    assert shown_map >= window.map_tabs.minimumSizeHint().width()
    assert listed + chat + shown_map <= SMALL[0]
