"""CaptionLabel: a map's caption, as tall as its wrapped text needs and never shorter than
three lines.

The captions were a fixed three lines high. A sliding-window model adds a line of its KV groups
("15 full-attention + 12 sliding (8-token window) blocks held · ..."), and at the widths a
1024-pixel window leaves each map the first line wraps too, so the groups line fell below the
label's bottom edge and was cut off where the grid begins. Three lines stay the least height,
so the grid does not jump as figures change length; more lines push the grid down.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel

MIN_LINES = 3


class CaptionLabel(QLabel):
    def __init__(self, text: str = "") -> None:
        super().__init__(text)
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setWordWrap(True)
        self.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        self._fit_height()

    def least_height(self) -> int:
        """Three lines of the caption's font (the old fixed height)."""
        return MIN_LINES * self.fontMetrics().lineSpacing() + 4

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        if text != self.text():
            super().setText(text)
            self._fit_height()

    def setStyleSheet(self, sheet: str) -> None:  # noqa: N802 (a font size changes the lines)
        super().setStyleSheet(sheet)
        self.ensurePolished()
        self._fit_height()

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self._fit_height()

    def _fit_height(self) -> None:
        width = self.width() if self.width() > 0 else self.sizeHint().width()
        self.setMinimumHeight(0)  # QLabel's heightForWidth is never below its minimum height
        needed = self.heightForWidth(width)
        self.setFixedHeight(max(self.least_height(), needed))
