"""ChatHeader: the chat's title beside its System prompt and Sampling toggles, or above them
when the column is too narrow for both.

In one row at 1024 px the toggles took all but ~20 px of the chat column and the title read
"W…"; a title needs TITLE_MIN_PX to say which chat is open.
"""

from __future__ import annotations

from PySide6.QtWidgets import QGridLayout, QLabel, QToolButton, QWidget

TITLE_MIN_PX = 160


class ChatHeader(QWidget):
    def __init__(self, title: QLabel, toggles: list[QToolButton]) -> None:
        super().__init__()
        self.title = title
        self.toggles = toggles
        self.grid = QGridLayout(self)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.stacked: bool | None = None
        self._arrange(stacked=False)

    def _toggles_width(self) -> int:
        spacing = self.grid.horizontalSpacing()
        return sum(t.sizeHint().width() + spacing for t in self.toggles)

    def _arrange(self, stacked: bool) -> None:
        if stacked == self.stacked:
            return
        self.stacked = stacked
        for widget in (self.title, *self.toggles):
            self.grid.removeWidget(widget)
        if stacked:  # the title across the column, the toggles below it on the right
            self.grid.addWidget(self.title, 0, 0, 1, len(self.toggles) + 1)
            for i, toggle in enumerate(self.toggles):
                self.grid.addWidget(toggle, 1, i + 1)
        else:
            self.grid.addWidget(self.title, 0, 0)
            for i, toggle in enumerate(self.toggles):
                self.grid.addWidget(toggle, 0, i + 1)
        self.grid.setColumnStretch(0, 1)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._arrange(stacked=self.width() - self._toggles_width() < TITLE_MIN_PX)
