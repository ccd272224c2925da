"""RepoList: the repos a search found (or the curated list), a few lines each.

The first line is the repo's id, elided in the middle so its org and its model name both stay
readable in a narrow column; then what the hub says of it: downloads, likes and when it was
updated, and its licence on a line of its own. A curated repo's description is its tooltip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QListWidget, QListWidgetItem, QWidget

from kvscope.app.desktop.get_model.texts import repo_brief, repo_line

if TYPE_CHECKING:
    from kvscope.app.core.hub.search import HubRepo

REPO_ROLE = Qt.ItemDataRole.UserRole


class RepoList(QListWidget):
    repo_chosen = Signal(object)  # HubRepo

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("hubRepos")
        self.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setWordWrap(False)
        self.setMinimumWidth(260)
        self.currentItemChanged.connect(self._current_changed)

    def set_repos(self, repos: list[HubRepo]) -> None:
        """Show `repos` in order and choose the first (its files show beside)."""
        self.blockSignals(True)
        self.clear()
        for repo in repos:
            item = QListWidgetItem(f"{repo.repo}\n{repo_brief(repo)}")
            item.setData(REPO_ROLE, repo)
            tip = [repo.repo, repo_line(repo)]
            if repo.description:
                tip.append(repo.description)
            item.setToolTip("\n".join(tip))
            self.addItem(item)
        self.blockSignals(False)
        if repos:
            self.setCurrentRow(0)  # emits repo_chosen

    def repos(self) -> list[HubRepo]:
        items = (self.item(row) for row in range(self.count()))
        return [item.data(REPO_ROLE) for item in items if item is not None]

    def choose(self, repo_id: str) -> bool:
        """Make the repo with this id current; False when it is not listed."""
        for row, repo in enumerate(self.repos()):
            if repo.repo == repo_id:
                self.setCurrentRow(row)
                return True
        return False

    def _current_changed(self, item: QListWidgetItem | None, _previous: object) -> None:
        if item is not None:
            self.repo_chosen.emit(item.data(REPO_ROLE))
