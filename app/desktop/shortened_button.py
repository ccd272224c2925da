"""ShortenedToolButton: a status-bar button that says less rather than widen the window.

A QToolButton's least width is its text's, so a button naming a file ("Recording saved:
session-20261203-114427.jsonl · Show in folder", 467 px) made the status bar, and so the window,
refuse to be narrower than 1,157 px: on a 1024-px screen the window ran off it. This one shows
its full text where the bar has room and a short form ("Saved · Show in folder") where it has
not; its tooltip says the rest. Eliding the full text instead read "Recor…older" at 1024 px.
"""

from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtWidgets import QSizePolicy, QToolButton


class ShortenedToolButton(QToolButton):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._full = self._short = ""
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)

    def full_text(self) -> str:
        return self._full

    def set_texts(self, full: str, short: str) -> None:
        """`full` where it fits, else `short` (which sets the button's least width)."""
        self._full, self._short = full, short
        self._fit()
        self.updateGeometry()

    def _width_of(self, text: str) -> int:
        chrome = super().sizeHint().width() - self.fontMetrics().horizontalAdvance(super().text())
        return chrome + self.fontMetrics().horizontalAdvance(text)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        return QSize(self._width_of(self._full), super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        least = min(self._width_of(self._short or self._full), self._width_of(self._full))
        return QSize(least, super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._fit()

    def _fit(self) -> None:
        fits = self.width() >= self._width_of(self._full) or not self._short
        shown = self._full if fits else self._short
        if shown != super().text():
            super().setText(shown)
