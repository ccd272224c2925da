"""GetModelWindow: search the Hugging Face Hub, see what fits this machine, download, open.

Top: the search box; before the user types, the curated list of good small instruct models
(app/core/hub/curated.py). Middle: the repos found (downloads, likes, updated, licence) beside
the chosen repo's GGUF models, each with its quant, size and this machine's verdict, read from
the file's own header with HTTP Range requests only for the rows in view. Bottom: the downloads,
several at once, each with progress, speed, time left, Pause, Resume, Cancel, and Open when done.

Every hub request runs on HubJobs' thread pool and every download on a thread of its own: the
window never waits for the network. Closing the window hides it; downloads go on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.desktop.get_model.downloads_panel import DownloadsPanel
from kvscope.app.desktop.get_model.file_panel import FilePanel
from kvscope.app.desktop.get_model.hub_jobs import FileKey, HubJobs
from kvscope.app.desktop.get_model.look import muted, set_error
from kvscope.app.desktop.get_model.repo_list import RepoList

if TYPE_CHECKING:
    from kvscope.app.core.hub.http_range import RetryPolicy
    from kvscope.app.core.hub.search import FitVerdict, HubFile, HubRepo
    from kvscope.app.desktop.get_model.download_row import DownloadRow

CURATED_LINE = (
    "Good small instruct models to start with, with their licences. Type a name to search all "
    "GGUF models on the hub."
)
MIN_SIZE = (760, 520)
BROWSE_SHARE = 0.62  # of the height, for the repos and files; the downloads take the rest


class GetModelWindow(QWidget):
    open_requested = Signal(str)  # a downloaded model's local path: load it into the engine

    def __init__(self, parent: QWidget | None = None, policy: RetryPolicy | None = None) -> None:
        super().__init__(parent, Qt.WindowType.Window)
        self.setWindowTitle("Get a model")
        self.setObjectName("getModelWindow")
        self.setMinimumSize(*MIN_SIZE)
        self.jobs = HubJobs(self)
        self.search_box = QLineEdit(
            placeholderText="Search GGUF models on the Hugging Face Hub: qwen, llama 3.2, gemma…"
        )
        self.search_box.setObjectName("hubSearch")
        self.search_box.setClearButtonEnabled(True)
        self.search_button = QPushButton("Search")
        self.status = muted(QLabel(wordWrap=True))
        self.status.setObjectName("hubStatus")
        self.repos = RepoList()
        self.files = FilePanel()
        self.downloads = DownloadsPanel(policy=policy)

        search_row = QHBoxLayout()
        search_row.addWidget(self.search_box, 1)
        search_row.addWidget(self.search_button)
        browse = QSplitter(Qt.Orientation.Horizontal)
        browse.setChildrenCollapsible(False)
        browse.addWidget(self.repos)
        browse.addWidget(self.files)
        browse.setStretchFactor(0, 2)
        browse.setStretchFactor(1, 3)
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.addWidget(browse)
        self.splitter.addWidget(self.downloads)
        layout = QVBoxLayout(self)
        layout.addLayout(search_row)
        layout.addWidget(self.status)
        layout.addWidget(self.splitter, 1)

        self.search_box.returnPressed.connect(self.search)
        self.search_button.clicked.connect(self.search)
        self.repos.repo_chosen.connect(self._repo_chosen)
        self.files.table.verdicts_wanted.connect(self._judge)
        self.files.table.download_requested.connect(self.download)
        self.jobs.searched.connect(self._searched)
        self.jobs.listed.connect(self._listed)
        self.jobs.judged.connect(self._judged)
        self.downloads.open_requested.connect(self.open_requested)
        self._listings: dict[str, list[HubFile]] = {}  # repo -> its files, once listed
        self._current: HubRepo | None = None
        self._sized = False
        self.show_curated()
        self._show_unfinished()

    # ---- search -----------------------------------------------------------------------------
    def show_curated(self) -> None:
        """The list before the user types: the curated models (no request: a static table)."""
        from kvscope.app.core.hub.search import curated_models

        self._say(CURATED_LINE)
        self.repos.set_repos(curated_models())

    def search(self) -> None:
        """Search the hub for the box's text (the curated list again when it is empty)."""
        query = self.search_box.text().strip()
        if not query:
            self.show_curated()
            return
        self.jobs.search(query)
        self._say(f"Searching the hub for “{query}”…")

    def _searched(self, ticket: int, result: list[HubRepo] | str) -> None:
        if ticket != self.jobs.ticket:
            return  # an older search's answer
        query = self.search_box.text().strip()
        if isinstance(result, str):
            self._say(f"The search failed: {result}", error=True)
            return
        for repo in result:  # a search lists each repo's files with it
            self._listings[repo.repo] = repo.files
        if not result:
            self._say(f"No GGUF models on the hub match “{query}”.")
        else:
            repos = "1 repo" if len(result) == 1 else f"{len(result)} repos"
            self._say(f"{repos} match “{query}”, most downloaded first.")
        self.repos.set_repos(result)

    # ---- a repo's files and their verdicts ---------------------------------------------------
    def choose_repo(self, repo_id: str) -> bool:
        """Show `repo_id`'s files if it is listed (the first-run offer's entries are)."""
        return self.repos.choose(repo_id)

    def _repo_chosen(self, repo: HubRepo) -> None:
        self._current = repo
        self.files.show_repo(repo)
        listed = self._listings.get(repo.repo)
        if listed is not None:
            self.files.show_files(listed)
        else:
            self.jobs.list_files(repo.repo)

    def _listed(self, repo_id: str, result: list[HubFile] | str) -> None:
        if not isinstance(result, str):
            self._listings[repo_id] = result
        if self._current is None or self._current.repo != repo_id:
            return  # the user moved on; kept for when they come back
        if isinstance(result, str):
            self.files.show_error(f"Cannot list the files: {result}")
        else:
            self.files.show_files(result)

    def _judge(self, files: list[HubFile]) -> None:
        for hub_file in files:
            self.jobs.judge(hub_file)

    def _judged(self, key: FileKey, result: FitVerdict | str) -> None:
        self.files.set_verdict(key, result)

    # ---- downloads --------------------------------------------------------------------------
    def download(self, hub_file: HubFile) -> DownloadRow:
        """Start downloading `hub_file` (all its parts); its row in the downloads panel."""
        return self.downloads.start(hub_file.repo, hub_file.file)

    def shutdown(self) -> None:
        """The app is closing: no new requests; downloads pause (their bytes stay to resume)."""
        self.jobs.shutdown()
        self.downloads.pause_all()

    def _show_unfinished(self) -> None:
        """Downloads an earlier session left part-way, ready to resume."""
        from kvscope.app.core.hub.pull import pending_partials

        self.downloads.show_stopped(pending_partials())

    def _say(self, line: str, error: bool = False) -> None:
        self.status.setText(line)
        set_error(self.status, error)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        if not self._sized:  # the first show: the browser gets most room
            self._sized = True
            height = self.splitter.height()
            browse = int(height * BROWSE_SHARE)
            self.splitter.setSizes([browse, height - browse])
