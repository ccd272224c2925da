"""DownloadsPanel: every download of this session (several run at once), newest first, in a
scrolling list, and those an earlier session left unfinished, ready to resume.

One file downloads once at a time: a second Download of it shows the row already there. Rows
end as done (Open), failed (the reason, Retry) or cancelled, and stay until removed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QScrollArea, QVBoxLayout, QWidget

from kvscope.app.desktop.get_model.download_row import DownloadRow
from kvscope.app.desktop.get_model.download_task import DownloadTask
from kvscope.app.desktop.get_model.look import bold, muted

if TYPE_CHECKING:
    from kvscope.app.core.hub.cache_layout import PartialState
    from kvscope.app.core.hub.http_range import RetryPolicy

ENDED = ("done", "failed", "cancelled")
EMPTY_TEXT = "Nothing downloading. Choose a file above and press Download."


class DownloadsPanel(QWidget):
    open_requested = Signal(str)  # a finished download's local path

    def __init__(self, parent: QWidget | None = None, policy: RetryPolicy | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("downloadsPanel")
        self._policy = policy  # retry timings: the pull's defaults, shorter in tests
        self.title = bold(QLabel("Downloads"))
        self.empty = muted(QLabel(EMPTY_TEXT, wordWrap=True))
        self._list = QWidget()
        self._rows_layout = QVBoxLayout(self._list)
        self._rows_layout.setContentsMargins(0, 0, 0, 0)
        self._rows_layout.setSpacing(6)
        self._rows_layout.addWidget(self.empty)
        self._rows_layout.addStretch(1)
        self.rows_scroll = QScrollArea(widgetResizable=True)
        self.rows_scroll.setObjectName("downloadsScroll")
        self.rows_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.rows_scroll.setWidget(self._list)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.title)
        layout.addWidget(self.rows_scroll, 1)
        self._rows: list[DownloadRow] = []

    def rows(self) -> list[DownloadRow]:
        return list(self._rows)

    def row_for(self, repo: str, file: str) -> DownloadRow | None:
        """The row of this file that has not ended (running, paused or stopped), if any."""
        for row in self._rows:
            if (row.task.repo, row.task.file) == (repo, file) and row.state not in ENDED:
                return row
        return None

    def start(self, repo: str, file: str) -> DownloadRow:
        """Download `file` of `repo`; the row already running it when there is one."""
        running = self.row_for(repo, file)
        if running is not None:
            self.rows_scroll.ensureWidgetVisible(running)
            return running
        row = self._add(DownloadTask(repo, file, self, policy=self._policy))
        row.task.start()
        return row

    def show_stopped(self, states: list[PartialState]) -> None:
        """Rows for downloads an earlier session left part-way (their partial files and
        states in the cache), stopped, with Resume."""
        from kvscope.app.core.hub.cache_layout import RepoCache

        for state in states:
            if self.row_for(state.repo, state.file) is not None:
                continue
            cache = RepoCache.of(state.repo)
            try:
                have = cache.partial(state.etag).stat().st_size
            except OSError:
                continue  # gone since it was listed
            row = self._add(DownloadTask(state.repo, state.file, self, policy=self._policy))
            row.show_stopped(have, state.size)
            row.cancel_stopped.connect(lambda c=cache, e=state.etag: c.drop_partial(e))

    def pause_all(self) -> None:
        """Pause every running download (the app is closing: the bytes stay for next time)."""
        for row in self._rows:
            if row.task.running:
                row.task.pause()

    def _add(self, task: DownloadTask) -> DownloadRow:
        row = DownloadRow(task)
        row.open_requested.connect(self.open_requested)
        row.remove_requested.connect(lambda r=row: self._remove(r))
        self._rows.insert(0, row)
        self._rows_layout.insertWidget(0, row)
        self.empty.setVisible(False)
        self._count_changed()
        return row

    def _remove(self, row: DownloadRow) -> None:
        self._rows.remove(row)
        self._rows_layout.removeWidget(row)
        row.deleteLater()
        self.empty.setVisible(not self._rows)
        self._count_changed()

    def _count_changed(self) -> None:
        n = len(self._rows)
        self.title.setText(f"Downloads ({n})" if n else "Downloads")
