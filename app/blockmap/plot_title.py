"""Plot titles that wrap onto a second line instead of running into the neighbouring plot.

pyqtgraph's LabelItem keeps its text on one line and makes that line its minimum width, so in
a narrow map column a title (with its series names) spills over the next plot's title.
"""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextOption

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
