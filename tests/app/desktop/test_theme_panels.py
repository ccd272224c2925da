"""The light theme reaches every panel: the block map's tiles, maps and plots, the remote view,
and code blocks follow a theme switch both ways; the map's light colours read on a light ground
(issue 29, item 8)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6.QtGui import QColor, QImage, QPalette
from PySide6.QtWidgets import QApplication, QWidget

from kvscope.app.desktop.blockmap import colors, raster
from kvscope.app.desktop.blockmap.legend import key_snapshot
from kvscope.app.desktop.palette import DARK, LIGHT

REPLY = "Some code:\n\n```python\nx = 1  # " + "long " * 60 + "\n```\n\nDone."


def _dominant(widget: QWidget) -> str:
    """The colour most of a widget's pixels have, as #RRGGBB."""
    image = widget.grab().toImage().convertToFormat(QImage.Format.Format_RGB32)
    counts = Counter(
        image.pixelColor(x, y).name().upper()
        for x in range(0, image.width(), 3)
        for y in range(0, image.height(), 3)
    )
    return counts.most_common(1)[0][0]


def _themed(window, palette, qtbot) -> None:
    window.set_theme(palette.name)
    qtbot.wait(50)
    panel = window.blockmap
    map_colors = colors.MAP_COLORS[palette.name]
    for plots in [panel.plots, *window.remote_view.findChildren(pg.GraphicsLayoutWidget)]:
        assert plots.backgroundBrush().color().name().upper() == map_colors.background_hex
    for tile in panel.strip.tiles.values():
        assert _dominant(tile) == palette.surface
    assert _dominant(panel.paged_map) == map_colors.background_hex
    assert _dominant(window.remote_view) == palette.ground
    link = QApplication.palette().color(QPalette.ColorRole.Link).name().upper()
    assert link == palette.link  # chat links: Qt's own blue is unreadable on the dark bubbles
    light_ground = colors.luminance(_dominant(panel.key)) > 0.8  # the app's sheet colours it
    assert light_ground == (palette is LIGHT)
    # The status bar's warning ("naive allocator fits 1 sequence") reads on the bar's ground.
    sheet = window.status.warning_label.styleSheet()
    warning = sheet.split("color:")[1].split(";")[0].strip()
    assert colors.contrast(warning, _dominant(window.status)) >= 3.0, (warning, palette.name)
    # Code: the message's own code lines and the scroller laid over them.
    body = window.chat.bubbles()[-1].body
    (scroller,) = body.code_scrollers()
    code_line = next(
        b
        for b in (body.document().findBlockByNumber(i) for i in range(body.document().blockCount()))
        if b.text().startswith("x = 1")
    )
    assert code_line.blockFormat().background().color().name().upper() == palette.code_background
    assert _dominant(scroller) == palette.code_background
    keyword = scroller.document().begin().begin()
    while not keyword.atEnd() and "#" not in keyword.fragment().text():
        keyword += 1
    comment = keyword.fragment().charFormat().foreground().color()
    assert comment == QColor(palette.code_kinds["comment"])


@pytest.fixture()
def restore_dark():
    yield
    from kvscope.app.desktop.theme import theme_keeper

    theme_keeper().apply("dark")  # later tests read the dark colours


def test_a_theme_switch_reaches_every_panel(make_window, qtbot, restore_dark):
    window = make_window()
    conversation = window.store.create_conversation("Code")
    window.store.add_message(conversation.id, "assistant", REPLY)
    window.chats.open_conversation(conversation.id)
    qtbot.waitUntil(lambda: window.blockmap.paged is not None, timeout=30_000)

    def full_size() -> bool:  # tiles wide enough that their ground is most of their pixels
        window.resize(1400, 860)
        return window.width() == 1400

    qtbot.waitUntil(full_size, timeout=5_000)
    _themed(window, LIGHT, qtbot)
    _themed(window, DARK, qtbot)
    _themed(window, LIGHT, qtbot)


def test_the_light_map_colours_read_on_a_light_ground(restore_dark):
    light = colors.LIGHT_MAP
    ground = light.background_hex
    for hue in light.palette_hex:
        assert colors.contrast(hue, ground) >= 3.0, hue  # owner hues stand out from the ground
    assert colors.contrast(light.free_hex, ground) >= 1.2  # free cells show as cells
    assert colors.contrast(light.cached_hex, light.free_hex) >= 2.5  # a cached core shows
    for theme in (light,):  # (the dark map's yellow rings are 1.3:1: left as they were)
        for hue in theme.palette_hex:
            ring = colors.mix(
                np.uint32(theme.packed(hue)),
                np.uint32(theme.packed(theme.ring_hex)),
                raster.RING_WHITENESS[0],
            )
            assert colors.contrast(colors.css(int(ring)), hue) >= 1.5, (theme.name, hue)
    # Drawn: the key's free, cached and shared cells in the light theme's colours.
    from kvscope.app.desktop.theme import theme_keeper

    theme_keeper().apply("light")
    cell = 14
    image = raster.rasterize(key_snapshot(), cols=6, cell_px=cell)

    def pixel(col: int, x: int, y: int) -> str:
        return colors.css(int(colors.pack(image[y, col * cell + x])))

    assert pixel(0, 6, 6) == light.free_hex  # free
    assert pixel(1, 6, 6) == light.cached_hex  # cached: its core
    assert pixel(1, 0, 0) == light.free_hex  # ... in a free cell
    shared_fill, shared_ring = pixel(4, 6, 6), pixel(4, 0, 0)
    assert colors.luminance(shared_ring) < colors.luminance(shared_fill)  # ink, not white
    assert pixel(0, cell - 1, 6) == ground  # the gap between cells
