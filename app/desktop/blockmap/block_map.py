"""BlockMapView: every physical KV block as a cell of one pyqtgraph ImageItem.

The image is rebuilt from the snapshot's arrays (raster.py) on each new snapshot; the grid's
columns follow the view's shape so cells stay square and the pool fills the view. Zoom with the
wheel, pan by dragging; the pointer's image coordinates give the block under it. The hover
card is a top-level tooltip window placed at the pointer on screen, so the map's edges never
clip it. The map's ground, its cells and the card follow the theme (ThemeKeeper.changed): the
block map panel and the replay window both show them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection

import pyqtgraph as pg
from PySide6.QtCore import QPoint, QPointF, QRectF, Qt, Signal
from PySide6.QtWidgets import QLabel, QWidget

from kvscope.app.desktop.blockmap import colors, raster
from kvscope.app.desktop.palette import Palette, current
from kvscope.app.desktop.theme import theme_keeper
from kvscope.engine.kv.snapshot import KVSnapshot


def hover_style(p: Palette) -> str:
    background, text, border = p.card
    return (
        f"QLabel {{ background: {background}; color: {text}; border: 1px solid {border};"
        " border-radius: 4px; padding: 6px 8px; }"
    )


class BlockMapView(pg.GraphicsView):
    block_hovered = Signal(int)  # physical block under the pointer; -1 when it leaves the blocks
    block_clicked = Signal(int)  # physical block clicked; -1 for empty space

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, background=colors.BACKGROUND_HEX)
        self.view = pg.ViewBox(lockAspect=True, invertY=True, enableMenu=False)
        self.view.setDefaultPadding(0.01)
        self.setCentralItem(self.view)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.view.addItem(self.image)
        self.snapshot: KVSnapshot | None = None
        self.selected: frozenset[int] = frozenset()
        self.cols = self.rows = self.cell_px = 0
        self.hovered = -1
        self.auto_fit = True  # keep the pool fitted to the view until the user zooms or pans
        self.last_build_ms = 0.0  # RGBA build + setImage of the latest redraw
        # A tooltip window of its own (owned by the view): a child label would be clipped.
        self.hover_label = QLabel(self, Qt.WindowType.ToolTip)
        self.hover_label.setTextFormat(Qt.TextFormat.RichText)
        self.hover_label.setWordWrap(True)
        self.hover_label.setMaximumWidth(380)
        self.hover_label.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
        self.hover_label.hide()
        self._pointer = QPoint(0, 0)
        self.setMouseTracking(True)
        self.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self.scene().sigMouseClicked.connect(self._on_mouse_clicked)
        self.view.sigRangeChangedManually.connect(self._on_user_range)
        # The view's own bound method, not follow_theme's child follower: with one, pyqtgraph's
        # close() (setViewport(None)) crashed a shown view
        # (tests/app/desktop/blockmap/test_blockmap.py, 100k).
        self._restyle(current())
        theme_keeper().changed.connect(self._restyle)

    def _restyle(self, palette: Palette) -> None:
        """The theme's ground, card and cell colours (raster.py reads the theme on show)."""
        self.setBackground(colors.active().background_hex)
        self.hover_label.setStyleSheet(hover_style(palette))
        self._redraw()

    # ---- content ---------------------------------------------------------------------------
    def set_snapshot(
        self, snapshot: KVSnapshot | None, selected: Collection[int] = frozenset()
    ) -> None:
        resized = snapshot is not None and (
            self.snapshot is None or snapshot.num_blocks != self.snapshot.num_blocks
        )
        self.snapshot = snapshot
        self.selected = frozenset(selected)
        if snapshot is None:
            self.image.clear()
            self.hide_hover()
            return
        if resized:
            self._relayout(force=True)
        else:
            self._redraw()

    def set_selected(self, selected: Collection[int]) -> None:
        if frozenset(selected) != self.selected:
            self.set_snapshot(self.snapshot, selected)

    def _relayout(self, force: bool = False) -> None:
        if self.snapshot is None:
            return
        width, height = self._view_pixels()
        cols, rows = raster.grid_shape(self.snapshot.num_blocks, width / height)
        cell_px = raster.cell_pixels(cols, rows, width, height)
        if force:
            self.auto_fit = True
        if force or (cols, rows, cell_px) != (self.cols, self.rows, self.cell_px):
            self.cols, self.rows, self.cell_px = cols, rows, cell_px
            self._redraw()
        if self.auto_fit:
            self.fit()

    def _view_pixels(self) -> tuple[int, int]:
        return max(int(self.view.width()), 40), max(int(self.view.height()), 40)

    def fit(self) -> None:
        """Show the whole pool, centred horizontally, top-aligned. Cells with a gap are shown at
        one image pixel per screen pixel (a scaled one-pixel gap would come and go); gapless
        tiny cells are stretched to fill the view."""
        if not self.cell_px:
            return
        width, height = self._view_pixels()
        scale = self.cell_px if self.cell_px >= 4 else min(width / self.cols, height / self.rows)
        w, h = width / scale, height / scale
        self.view.setRange(QRectF(-(w - self.cols) / 2, 0, w, h), padding=0)
        self.auto_fit = True

    def _on_user_range(self, *_args) -> None:
        self.auto_fit = False

    def _redraw(self) -> None:
        if self.snapshot is None or self.cols == 0:
            return
        start = time.perf_counter()
        rgba = raster.rasterize(self.snapshot, self.cols, self.cell_px, self.selected)
        self.image.setImage(rgba, autoLevels=False)
        self.image.setRect(QRectF(0, 0, self.cols, self.rows))
        self.last_build_ms = (time.perf_counter() - start) * 1e3

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        if hasattr(self, "snapshot"):  # GraphicsView's own __init__ resizes before ours runs
            self._relayout()

    # ---- pointer ---------------------------------------------------------------------------
    def block_at(self, x: float, y: float) -> int:
        """The block at view (grid) coordinates x, y; -1 outside the pool."""
        if self.snapshot is None or not (math.isfinite(x) and math.isfinite(y)):
            return -1
        col, row = math.floor(x), math.floor(y)
        if not (0 <= col < self.cols and 0 <= row < self.rows):
            return -1
        block = row * self.cols + col
        return block if block < self.snapshot.num_blocks else -1

    def block_center(self, block: int) -> QPointF:
        """View coordinates of a block's centre (the inverse of block_at)."""
        return QPointF(block % self.cols + 0.5, block // self.cols + 0.5)

    def _block_at_scene(self, scene_pos: QPointF) -> int:
        p = self.view.mapSceneToView(scene_pos)
        return self.block_at(p.x(), p.y())

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        self._pointer = self.mapFromScene(scene_pos)
        self._set_hovered(self._block_at_scene(scene_pos))
        if self.hover_label.isVisible():
            self._place_hover()

    def _on_mouse_clicked(self, event) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return
        if event.double():
            self.fit()  # double-click: back to the whole pool
        else:
            self.block_clicked.emit(self._block_at_scene(event.scenePos()))

    def _set_hovered(self, block: int) -> None:
        if block != self.hovered:
            self.hovered = block
            if block < 0:
                self.hide_hover()
            self.block_hovered.emit(block)

    def leaveEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self._set_hovered(-1)
        super().leaveEvent(event)

    # ---- hover card ------------------------------------------------------------------------
    def show_hover(self, html: str, at: QPoint | None = None) -> None:
        """Show the hover card (rich text) near the pointer, or near `at` (widget pixels)."""
        if at is not None:
            self._pointer = at
        self.hover_label.setText(html)
        self.hover_label.adjustSize()
        self._place_hover()
        self.hover_label.show()  # a tooltip window: on top without raise_()

    def hide_hover(self) -> None:
        self.hover_label.hide()

    def hideEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self.hide_hover()  # a top-level card would otherwise outlive its hidden map
        super().hideEvent(event)

    def _place_hover(self) -> None:
        """Below right of the pointer, flipped to its other side where the screen ends."""
        size = self.hover_label.size()
        pointer = self.mapToGlobal(self._pointer)
        screen = (self.screen() or self.hover_label.screen()).availableGeometry()
        x, y = pointer.x() + 16, pointer.y() + 16
        if x + size.width() > screen.right():
            x = pointer.x() - size.width() - 12
        if y + size.height() > screen.bottom():
            y = pointer.y() - size.height() - 12
        x = min(max(x, screen.left()), screen.right() - size.width())
        y = min(max(y, screen.top()), screen.bottom() - size.height())
        self.hover_label.move(x, y)

    def point_of_block(self, block: int) -> QPoint:
        """Widget pixel of a block's centre (where a pointer hovering it would be)."""
        return self.mapFromScene(self.view.mapViewToScene(self.block_center(block)))
