"""The panels the first light theme left dark follow a theme switch both ways: the replay window,
the block map's hover card, the remote view's prefix tree and routing table (issue 29, item 8).
Each is grabbed offscreen and its pixels read: its ground is the theme's, and the colours drawn
on it (replica hues, bar counts, card asides) read on that ground."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QWidget
from recordings import STEP, header
from remote_views import A

from kvscope.app.desktop.blockmap import colors
from kvscope.app.desktop.blockmap.legend import key_snapshot
from kvscope.app.desktop.blockmap.tooltip import describe_block
from kvscope.app.desktop.palette import DARK, LIGHT, Palette
from kvscope.app.desktop.recording import replay_view
from kvscope.app.desktop.theme import theme_keeper
from kvscope.app.remote.routing import RouteHit

USED = {"kind": "blocks_allocated", "step": 1, "time": 1.0, "seq_id": 7, "blocks": [0, 1]}


def _colours(widget: QWidget) -> Counter:
    image = widget.grab().toImage().convertToFormat(QImage.Format.Format_RGB32)
    return Counter(
        image.pixelColor(x, y).name().upper()
        for x in range(0, image.width(), 2)
        for y in range(0, image.height(), 2)
    )


def _dominant(widget: QWidget) -> str:
    return _colours(widget).most_common(1)[0][0]


def _corner(widget: QWidget) -> str:
    """The colour just inside a widget's top-left corner: its own ground."""
    return widget.grab().toImage().pixelColor(2, 2).name().upper()


def _is_light(color: str) -> bool:
    return colors.luminance(color) > 0.6


@pytest.fixture()
def themes():
    """Switches the application's theme; dark again afterwards (later tests read dark)."""
    keeper = theme_keeper()

    def switch(palette: Palette) -> None:
        keeper.apply(palette.name)

    yield switch
    keeper.apply("dark")


def test_the_replay_window_follows_the_theme(qtbot, tmp_path, themes):
    path = tmp_path / "session.jsonl"
    lines = [header(), STEP, {**STEP, "step": 2}]
    path.write_text("\n".join(json.dumps(line) for line in lines))
    dialog = replay_view.open_recording(path)
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.loader.done and dialog.num_steps() == 2, timeout=30_000)
    dialog.poll()
    for palette in (LIGHT, DARK, LIGHT):
        themes(palette)
        qtbot.wait(20)
        assert _corner(dialog) == palette.ground, palette.name
        for view in (dialog.paged_map, dialog.shadow_map):
            assert _dominant(view) == colors.MAP_COLORS[palette.name].background_hex
        caption = dialog.paged_caption.palette().color(dialog.paged_caption.foregroundRole())
        assert caption.name().upper() == palette.text
        # The step's caption names the pool in the theme's series colour.
        paged_hex = colors.MAP_COLORS[palette.name].paged_hex
        assert paged_hex in dialog.paged_caption.text().upper()


def test_the_hover_card_follows_the_theme(qtbot, themes):
    from kvscope.app.desktop.blockmap.block_map import BlockMapView

    view = BlockMapView()
    qtbot.addWidget(view)
    view.resize(300, 200)
    snapshot = key_snapshot()
    for palette in (LIGHT, DARK):
        themes(palette)
        html = describe_block(snapshot, 4, info={"text": "a\nb", "token_ids": [1, 2]})
        view.show_hover(html)
        card = _dominant(view.hover_label)
        assert _is_light(card) == (palette is LIGHT), (palette.name, card)
        # Every colour the card's text names is the theme's, none the other theme's.
        named = {c.upper() for c in re.findall(r"color:\s*(#[0-9A-Fa-f]{6})", html)}
        other = DARK if palette is LIGHT else LIGHT
        assert palette.card_aside in named and palette.card_emphasis in named
        assert not named & {other.card_aside, other.card_emphasis, other.faint}
        for color in named:  # asides, the shared line, the owner's swatch: all read on the card
            assert colors.contrast(color, card) >= 3.0, (palette.name, color)
        view.hide_hover()


def test_the_prefix_tree_and_routing_table_follow_the_theme(two_replicas, qtbot, themes):  # noqa: F811
    view, _connections, _snaps, _monitors = two_replicas
    tree, box = view.tree, view.routing
    box.tokenize = lambda _connection, _model, _messages: list(range(40))
    box.predict = lambda ids: [RouteHit(A, 2, 3, 32, "token ids")]
    box.prompt.setText("a new prompt")
    box.check()
    qtbot.waitUntil(lambda: not box.busy() and bool(box.rows()), timeout=10_000)
    for palette in (LIGHT, DARK, LIGHT):
        themes(palette)
        qtbot.wait(20)
        assert _is_light(_dominant(tree.viewport())) == (palette is LIGHT), palette.name
        assert _is_light(_dominant(box.table.viewport())) == (palette is LIGHT), palette.name
        best = box.table.item(0, 1)  # the rows are written again in the theme's colours
        assert best.background().color().name().upper() == palette.best_row
        replica = box.table.item(0, 0).foreground().color().name().upper()
        assert replica == colors.themed_hex(view.colors.color(A))
        hues = {item.foreground(1).color().name().upper() for item in tree.items()}
        assert replica in hues  # the HELD BY column names replicas in the same hues
        if palette is LIGHT:  # the dark map's hues (a yellow) would not read on white
            for hue in hues:
                assert colors.contrast(hue, palette.well) >= 3.0, hue
                assert colors.contrast(palette.on_bar, hue) >= 3.0, hue  # a bar's count
