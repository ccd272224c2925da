"""LensMarker: the outline, on the overview, of the bins the lens shows.

The lens's blocks are a run of consecutive bins, so the outline is at most three rectangles
(the first row's tail, whole rows, the last row's head) joined into one path, drawn with a
one-pixel cosmetic pen so it stays thin at any bin size. The path runs one screen pixel outside
the bins, so the line never hides a bin inside the lens (a one-row lens is 2 px tall)."""

from __future__ import annotations

from PySide6.QtCore import QRectF
from PySide6.QtGui import QColor, QPainterPath, QPen
from PySide6.QtWidgets import QGraphicsPathItem

from kvscope.app.desktop.blockmap.bins import BinGrid


def lens_rects(grid: BinGrid, start: int, stop: int) -> list[QRectF]:
    """Rectangles in bin-grid units covering the bins of blocks [start, stop)."""
    if stop <= start:
        return []
    first, last = grid.bin_of(start), grid.bin_of(stop - 1)
    first_row, first_col = divmod(first, grid.cols)
    last_row, last_col = divmod(last, grid.cols)
    if first_row == last_row:
        return [QRectF(first_col, first_row, last_col - first_col + 1, 1)]
    rects = [QRectF(first_col, first_row, grid.cols - first_col, 1)]
    if last_row - first_row > 1:
        rects.append(QRectF(0, first_row + 1, grid.cols, last_row - first_row - 1))
    rects.append(QRectF(0, last_row, last_col + 1, 1))
    return rects


class LensMarker(QGraphicsPathItem):
    def __init__(self) -> None:
        super().__init__()
        self.setZValue(10)  # over the overview's image

    def show_range(self, grid: BinGrid, start: int, stop: int, color: str) -> None:
        path = QPainterPath()
        outside = 1 / grid.bin_px  # one screen pixel, in bin units
        for rect in lens_rects(grid, start, stop):
            piece = QPainterPath()
            piece.addRect(rect.adjusted(-outside, -outside, outside, outside))
            path = path.united(piece)
        pen = QPen(QColor(color))
        pen.setCosmetic(True)
        pen.setWidthF(1.0)
        self.setPen(pen)
        self.setPath(path)
