"""ElidedLabel: a one-line label that may be narrower than its text and ends it with "…".

A plain QLabel's minimum width is its text's width, so one long line (the status bar's model
description) can make the whole window refuse to be narrower than that line.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel

MIN_CHARS = 12  # enough to recognise what the label is about


class ElidedLabel(QLabel):
    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        width = self.fontMetrics().horizontalAdvance("x" * MIN_CHARS)
        return QSize(min(width, super().sizeHint().width()), super().minimumSizeHint().height())

    def is_elided(self) -> bool:
        """Whether the text is cut short at the label's current width."""
        return self.fontMetrics().horizontalAdvance(self.text()) > self.contentsRect().width()

    def paintEvent(self, _event) -> None:  # noqa: N802 (Qt's name)
        painter = QPainter(self)
        rect = self.contentsRect()
        text = self.fontMetrics().elidedText(self.text(), Qt.ElideRight, rect.width())
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(rect, int(self.alignment() | Qt.AlignVCenter), text)
