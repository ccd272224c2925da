"""BlockMapView: the KV pool as pyqtgraph images, one cell per block or an overview and a lens.

While one cell per block stays readable (map_geometry.MIN_CELL_PX) the whole pool is one image
built from the snapshot's arrays (raster.py); its grid's columns follow the view's shape so
cells stay square and the pool fills the view. Zoom with the wheel, pan by dragging.

A larger pool is drawn the way profilers draw a long timeline: an overview of the whole pool in
bins (bins.py, overview.py), where every held or cached block shows, over a lens of whole rows
at readable cell size (lens.py) that follows the selected sequence, else the busiest region.
A click on the overview moves the lens there and pins it; the wheel scrolls the lens; a
double-click follows again. Hovering a bin names its range, states and dominant sequences.

In both, the pointer's lens coordinates give the block under it. The hover card is a top-level
tooltip window placed at the pointer on screen, so the map's edges never clip it. The map's
ground, its cells and the card follow the theme (ThemeKeeper.changed): the block map panel,
the what-if tab and the replay window all show them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection

import pyqtgraph as pg
from PySide6.QtCore import QPoint, QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QFont, QFontMetrics
from PySide6.QtWidgets import QWidget

from kvscope.app.desktop.blockmap import bins, colors, lens, overview, raster
from kvscope.app.desktop.blockmap.bin_card import describe_bin
from kvscope.app.desktop.blockmap.hover_card import HoverCard, hover_style
from kvscope.app.desktop.blockmap.lens_marker import LensMarker
from kvscope.app.desktop.blockmap.map_geometry import CAPTION_PX, SPACING_PX, MapGeometry, plan
from kvscope.app.desktop.palette import Palette, current
from kvscope.app.desktop.theme import theme_keeper
from kvscope.engine.kv.snapshot import KVSnapshot


class BlockMapView(pg.GraphicsView):
    block_hovered = Signal(int)  # physical block under the pointer; -1 when it leaves the blocks
    block_clicked = Signal(int)  # physical block clicked; -1 for empty space

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, background=colors.BACKGROUND_HEX)
        self.layout_item = pg.GraphicsLayout()
        self.layout_item.setContentsMargins(0, 0, 0, 0)
        self.layout_item.setSpacing(SPACING_PX)
        self.setCentralItem(self.layout_item)
        self.overview = pg.ViewBox(lockAspect=True, invertY=True, enableMenu=False)
        self.overview.setMouseEnabled(False, False)
        self.overview_image = pg.ImageItem(axisOrder="row-major")
        self.overview.addItem(self.overview_image)
        self.lens_marker = LensMarker()
        self.overview.addItem(self.lens_marker)
        self.lens_caption = pg.LabelItem(justify="left")
        self.view = pg.ViewBox(lockAspect=True, invertY=True, enableMenu=False)  # the cells
        self.view.setDefaultPadding(0.01)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.view.addItem(self.image)
        self.layout_item.addItem(self.overview, row=0, col=0)
        self.layout_item.addItem(self.lens_caption, row=1, col=0)
        self.layout_item.addItem(self.view, row=2, col=0)
        self.snapshot: KVSnapshot | None = None
        self.selected: frozenset[int] = frozenset()
        self.labels: dict[str, str] = {}  # group -> label, for the bins' hover card
        self.layout_plan = MapGeometry(0, 0, 0)
        self.cols = self.rows = self.cell_px = 0
        self.lens_row = 0  # first pool row the lens shows (binned only)
        self.follow = True  # the lens follows the selection or the busiest region
        self.hovered = -1
        self.hovered_bin = -1
        self.auto_fit = True  # keep the pool fitted to the view until the user zooms or pans
        self.last_build_ms = 0.0  # RGBA build + setImage of the latest redraw
        self.hover_label = HoverCard(self)
        self._pointer = QPoint(0, 0)
        self.setMouseTracking(True)
        self.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self.scene().sigMouseClicked.connect(self._on_mouse_clicked)
        self.view.sigRangeChangedManually.connect(self._on_user_range)
        self._show_overview(False)
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
        if frozenset(selected) != self.selected:
            self.follow = True  # a new selection: the lens goes to it
        self.snapshot = snapshot
        self.selected = frozenset(selected)
        if snapshot is None:
            self.image.clear()
            self.overview_image.clear()
            self.hide_hover()
            return
        if resized:
            self._relayout(force=True)
        else:
            self._redraw()

    def set_selected(self, selected: Collection[int]) -> None:
        if frozenset(selected) != self.selected:
            self.set_snapshot(self.snapshot, selected)

    @property
    def binned(self) -> bool:
        return self.layout_plan.binned

    def _show_overview(self, shown: bool) -> None:
        grid = self.layout_item.layout
        heights = (self.layout_plan.overview_px, CAPTION_PX) if shown else (0, 0)
        items = (self.overview, self.lens_caption)
        for row, (item, height) in enumerate(zip(items, heights, strict=True)):
            item.setVisible(shown)
            grid.setRowFixedHeight(row, height)
        grid.setRowSpacing(0, SPACING_PX if shown else 0)
        grid.setRowSpacing(1, SPACING_PX if shown else 0)
        self.view.setMouseEnabled(not shown, not shown)

    def _relayout(self, force: bool = False) -> None:
        if self.snapshot is None:
            return
        width, height = self._view_pixels()
        geometry = plan(self.snapshot.num_blocks, width, height)
        if force:
            self.auto_fit = True
            self.follow = True
        if force or geometry != self.layout_plan:
            self.layout_plan = geometry
            self.cols, self.rows, self.cell_px = geometry.cols, geometry.rows, geometry.cell_px
            self._show_overview(geometry.binned)
            self.layout_item.layout.activate()  # the views' new sizes now, for fit()'s ranges
            self._redraw()
        if self.auto_fit or self.binned:
            self.fit()

    def _view_pixels(self) -> tuple[int, int]:
        return max(self.width(), 40), max(self.height(), 40)

    def fit(self) -> None:
        """Show the whole pool (or the lens's rows), centred horizontally, top-aligned. Cells
        with a gap are shown at one image pixel per screen pixel (a scaled one-pixel gap would
        come and go); gapless tiny cells are stretched to fill the view."""
        if not self.cell_px:
            return
        width, height = self._view_pixels()
        g = self.layout_plan
        if g.grid is not None:
            over = g.grid
            w = width / over.bin_px
            rect = QRectF(-(w - over.cols) / 2, 0, w, g.overview_px / over.bin_px)
            self.overview.setRange(rect, padding=0)
            w = width / self.cell_px
            rect = QRectF(-(w - self.cols) / 2, self.lens_row, w, g.visible_rows)
            self.view.setRange(rect, padding=0)
            return
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
        if self.binned:
            self._redraw_binned()
        else:
            rgba = raster.rasterize(self.snapshot, self.cols, self.cell_px, self.selected)
            self.image.setImage(rgba, autoLevels=False)
            self.image.setRect(QRectF(0, 0, self.cols, self.rows))
        self.last_build_ms = (time.perf_counter() - start) * 1e3

    def lens_blocks(self) -> tuple[int, int]:
        """[start, stop) of the blocks the lens shows (the whole pool when not binned)."""
        if self.snapshot is None:
            return 0, 0
        if not self.binned:
            return 0, self.snapshot.num_blocks
        start = self.lens_row * self.cols
        stop = (self.lens_row + self.layout_plan.visible_rows) * self.cols
        return start, min(stop, self.snapshot.num_blocks)

    def _redraw_binned(self) -> None:
        snapshot, g = self.snapshot, self.layout_plan
        assert snapshot is not None and g.grid is not None
        palette = raster.owner_colors(snapshot)
        chosen = raster.selection_mask(snapshot, self.selected) if self.selected else None
        if self.follow:
            weights = chosen if chosen is not None and chosen.any() else lens.activity(snapshot)
            self.lens_row = lens.busiest_row(weights, g.cols, g.visible_rows, self.lens_row)
        self.lens_row = lens.clamp_row(self.lens_row, g.rows, g.visible_rows)
        start, stop = self.lens_blocks()
        counts = bins.count_bins(snapshot, g.grid, palette, chosen)
        shades = overview.bin_colors(counts, g.grid, palette, (start, stop), chosen is not None)
        background = palette.theme.packed(palette.theme.background_hex)
        self.overview_image.setImage(overview.compose(shades, g.grid, background), autoLevels=False)
        self.overview_image.setRect(QRectF(0, 0, g.grid.cols, g.grid.rows))
        self.lens_marker.show_range(g.grid, start, stop, palette.theme.ring_hex)
        style = raster.cell_style(snapshot, self.selected, slice(start, stop), palette)
        rgba = raster.compose(style, g.cols, g.cell_px)
        self.image.setImage(rgba, autoLevels=False)
        self.image.setRect(QRectF(0, self.lens_row, g.cols, rgba.shape[0] // g.cell_px))
        self._caption_lens(start, stop)
        self.fit()  # the lens's range follows its rows
        if self.hovered_bin >= 0:
            self._show_bin(self.hovered_bin)

    def _caption_lens(self, start: int, stop: int) -> None:
        p = current()
        per_dot = self.layout_plan.grid.blocks_per_bin if self.layout_plan.grid else 1
        texts = lens.captions(start, stop, self.follow, bool(self.selected), per_dot, p.faint)
        font = QFont(self.font())
        font.setPointSize(8)
        metrics, room = QFontMetrics(font), self.width() - 8  # the label's own margins
        text = next(
            (rich for rich, plain in texts if metrics.horizontalAdvance(plain) <= room), None
        )
        self.lens_caption.setText(text or texts[-1][0], color=p.text, size="8pt")

    def move_lens_to(self, block: int) -> None:
        """Centre the lens on a block's row and pin it there (binned only)."""
        g = self.layout_plan
        if not self.binned:
            return
        self.follow = False
        first = block // g.cols - g.visible_rows // 2
        self.lens_row = lens.clamp_row(first, g.rows, g.visible_rows)
        self._redraw()
        self.fit()

    def scroll_lens(self, rows: int) -> None:
        if self.binned:
            middle = self.lens_row + self.layout_plan.visible_rows // 2
            self.move_lens_to((middle + rows) * self.cols)

    def resume_follow(self) -> None:
        self.follow = True
        self._redraw()
        self.fit()

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        # GraphicsView's own __init__ resizes before ours runs; its close() clears the scene
        # (our items are gone) and then resizes the view as it drops the viewport.
        if hasattr(self, "snapshot") and not getattr(self, "closed", False):
            self._relayout()

    def wheelEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        if not self.binned:
            super().wheelEvent(event)
            return
        steps = event.angleDelta().y() / 120
        self.scroll_lens(-round(steps * max(1, self.layout_plan.visible_rows // 4)))
        event.accept()

    # ---- pointer ---------------------------------------------------------------------------
    def block_at(self, x: float, y: float) -> int:
        """The block at lens (grid) coordinates x, y; -1 outside the pool."""
        if self.snapshot is None or not (math.isfinite(x) and math.isfinite(y)):
            return -1
        col, row = math.floor(x), math.floor(y)
        if not (0 <= col < self.cols and 0 <= row < self.rows):
            return -1
        block = row * self.cols + col
        return block if block < self.snapshot.num_blocks else -1

    def block_center(self, block: int) -> QPointF:
        """Lens coordinates of a block's centre (the inverse of block_at)."""
        return QPointF(block % self.cols + 0.5, block // self.cols + 0.5)

    def bin_center(self, index: int) -> QPointF:
        """Overview coordinates of a bin's centre (binned only)."""
        cols = self.layout_plan.grid.cols if self.layout_plan.grid else 1
        return QPointF(index % cols + 0.5, index // cols + 0.5)

    def _in_overview(self, scene_pos: QPointF) -> bool:
        return self.binned and self.overview.sceneBoundingRect().contains(scene_pos)

    def _bin_at_scene(self, scene_pos: QPointF) -> int:
        if self.layout_plan.grid is None:
            return -1
        p = self.overview.mapSceneToView(scene_pos)
        return self.layout_plan.grid.bin_at(p.x(), p.y())

    def _block_at_scene(self, scene_pos: QPointF) -> int:
        if self.binned and not self.view.sceneBoundingRect().contains(scene_pos):
            return -1
        p = self.view.mapSceneToView(scene_pos)
        return self.block_at(p.x(), p.y())

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        self._pointer = self.mapFromScene(scene_pos)
        if self._in_overview(scene_pos):
            self._set_hovered(-1)
            index = self._bin_at_scene(scene_pos)
            if index != self.hovered_bin:
                self.hovered_bin = index
                if index < 0:
                    self.hide_hover()
                else:
                    self._show_bin(index)
        else:
            if self.hovered_bin >= 0:
                self.hovered_bin = -1
                self.hide_hover()
            self._set_hovered(self._block_at_scene(scene_pos))
        if self.hover_label.isVisible():
            self._place_hover()

    def _show_bin(self, index: int) -> None:
        if self.snapshot is None or self.layout_plan.grid is None:
            return
        start, stop = self.layout_plan.grid.block_range(index)
        self.show_hover(describe_bin(self.snapshot, start, stop, self.labels))

    def _on_mouse_clicked(self, event) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return
        if event.double():
            self.resume_follow() if self.binned else self.fit()  # back to the whole pool
        elif self._in_overview(event.scenePos()):
            index = self._bin_at_scene(event.scenePos())
            if index >= 0 and self.layout_plan.grid is not None:
                self.move_lens_to(self.layout_plan.grid.block_range(index)[0])
        else:
            self.block_clicked.emit(self._block_at_scene(event.scenePos()))

    def _set_hovered(self, block: int) -> None:
        if block != self.hovered:
            self.hovered = block
            if block < 0:
                self.hide_hover()
            self.block_hovered.emit(block)

    def leaveEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self.hovered_bin = -1
        self._set_hovered(-1)
        self.hide_hover()
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
        self.hover_label.place(self.mapToGlobal(self._pointer))

    def point_of_block(self, block: int) -> QPoint:
        """Widget pixel of a block's centre (where a pointer hovering it would be)."""
        return self.mapFromScene(self.view.mapViewToScene(self.block_center(block)))

    def point_of_bin(self, index: int) -> QPoint:
        """Widget pixel of an overview bin's centre."""
        return self.mapFromScene(self.overview.mapViewToScene(self.bin_center(index)))
