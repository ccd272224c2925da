"""ElidedLabel: a one-line label that may be narrower than its text and elides it with "…".

A plain QLabel's minimum width is its text's width, so one long line (the status bar's model
description) can make the whole window refuse to be narrower than that line. A model file name
is elided in the middle instead ("gemma-3-…-Q4_K_M.gguf"): its start says which model and its
end which quantization, and "ge…uf" says neither. elide_middle does the same for plain text.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel

MIN_CHARS = 12  # enough to recognise what the label is about


def elide_middle(text: str, max_chars: int) -> str:
    """`text` with its middle replaced by "…" so it is at most `max_chars` long."""
    if max_chars < 3:
        raise ValueError(f"max_chars must be at least 3, got {max_chars}")
    if len(text) <= max_chars:
        return text
    keep = max_chars - 1
    head = (keep + 1) // 2
    return f"{text[:head]}…{text[len(text) - (keep - head) :]}"


class ElidedLabel(QLabel):
    def __init__(
        self, *args, elide: Qt.TextElideMode = Qt.TextElideMode.ElideRight, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.elide_mode = elide

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        width = self.fontMetrics().horizontalAdvance("x" * MIN_CHARS)
        return QSize(min(width, super().sizeHint().width()), super().minimumSizeHint().height())

    def is_elided(self) -> bool:
        """Whether the text is cut short at the label's current width."""
        return self.fontMetrics().horizontalAdvance(self.text()) > self.contentsRect().width()

    def shown_text(self) -> str:
        """The text as painted at the label's current width."""
        width = self.contentsRect().width()
        return self.fontMetrics().elidedText(self.text(), self.elide_mode, width)

    def paintEvent(self, _event) -> None:  # noqa: N802 (Qt's name)
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        align = int(self.alignment() | Qt.AlignmentFlag.AlignVCenter)
        painter.drawText(self.contentsRect(), align, self.shown_text())
