"""Plot titles that wrap onto a second line instead of running into the neighbouring plot, and
the one look of the app's rolling plots (the block map's and the remote view's).

pyqtgraph's LabelItem keeps its text on one line and makes that line its minimum width, so in
a narrow map column a title (with its series names) spills over the next plot's title.
"""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QTextOption

TITLE_ROW_HEIGHT = 30  # pyqtgraph's own title row: room for two lines of 7-8 pt text


class WrappingTitle(pg.LabelItem):
    """A LabelItem whose text wraps at its width and which may be as narrow as its column."""

    def __init__(self, text: str = " ", parent=None, **opts) -> None:
        super().__init__(text, parent, **opts)
        self.item.document().setDocumentMargin(1)
        self.item.document().setDefaultTextOption(QTextOption(Qt.AlignmentFlag.AlignHCenter))

    def resizeEvent(self, ev) -> None:  # noqa: N802 (Qt's name)
        self.item.setTextWidth(max(1.0, self.rect().width()))
        super().resizeEvent(ev)

    def updateMin(self) -> None:  # noqa: N802 (pyqtgraph's name)
        natural = self.item.document().idealWidth()
        self.setMinimumSize(0, 0)
        self._sizeHint = {
            Qt.SizeHint.MinimumSize: (0, 0),
            Qt.SizeHint.PreferredSize: (natural, TITLE_ROW_HEIGHT),
            Qt.SizeHint.MaximumSize: (-1, -1),
            Qt.SizeHint.MinimumDescent: (0, 0),
        }
        self.updateGeometry()

    def text_fits(self) -> bool:
        """Whether every line of the text lies inside the label (nothing spills or is cut)."""
        return self.rect().contains(self.itemRect())


def wrap_title(plot: pg.PlotItem) -> WrappingTitle:
    """Swap the plot's title label for a WrappingTitle with the same text and style."""
    old = plot.titleLabel
    title = WrappingTitle(old.text, plot, **old.opts)
    plot.layout.removeItem(old)
    old.setParentItem(None)
    plot.layout.addItem(title, 0, 1)
    plot.titleLabel = title
    return title


def style_rolling_plot(plot: pg.PlotItem, window_s: float, y_range) -> None:
    """A read-only plot of the last `window_s` seconds (x from -window_s to 0) with a wrapping
    title, a faint grid and small grey ticks; `y_range` is a fixed (low, high) or the least
    top of a range from 0."""
    wrap_title(plot)
    plot.setMinimumWidth(0)
    plot.setMenuEnabled(False)
    plot.setMouseEnabled(x=False, y=False)
    plot.hideButtons()
    plot.showGrid(x=True, y=True, alpha=0.15)
    plot.setXRange(-window_s, 0, padding=0)
    if isinstance(y_range, tuple):
        plot.setYRange(*y_range, padding=0.06)
    else:
        plot.setYRange(0, y_range, padding=0)
    tick_font = QFont()
    tick_font.setPointSize(7)
    for axis in ("left", "bottom"):
        plot.getAxis(axis).setTextPen("#8C94A3")
        plot.getAxis(axis).setPen("#3A404C")
        plot.getAxis(axis).setStyle(tickFont=tick_font, tickTextOffset=3)
