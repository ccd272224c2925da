"""FilePanel: the chosen repo (its id, what the hub says of it, its description) over its files
(app/desktop/get_model/file_table.py), and the planner's whole sentence for the selected file.

While a repo's files are being listed, or when that failed, the panel says so in words.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

from kvscope.app.desktop.elided_label import ElidedLabel
from kvscope.app.desktop.get_model.file_table import FileTable
from kvscope.app.desktop.get_model.hub_jobs import FileKey, file_key
from kvscope.app.desktop.get_model.look import bold, muted, set_error
from kvscope.app.desktop.get_model.texts import repo_line, verdict_sentence

if TYPE_CHECKING:
    from kvscope.app.core.hub.search import FitVerdict, HubFile, HubRepo

DETAILS_HINT = "Select a file to read this machine's verdict in full."


class FilePanel(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.title = ElidedLabel(elide=Qt.TextElideMode.ElideMiddle)
        self.title.setObjectName("hubRepoTitle")
        bold(self.title)
        self.meta = muted(QLabel(wordWrap=True))
        self.status = muted(QLabel(wordWrap=True))
        self.table = FileTable()
        self.details = QLabel(DETAILS_HINT, wordWrap=True)
        self.details.setObjectName("hubVerdictDetails")
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # Its height follows the sentence, never pushing the table out of the window.
        self.details.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Minimum)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.title)
        layout.addWidget(self.meta)
        layout.addWidget(self.status)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.details)
        self._verdicts: dict[FileKey, FitVerdict | str] = {}
        self._selected: HubFile | None = None
        self.table.file_selected.connect(self._file_selected)
        self.show_repo(None)

    def show_repo(self, repo: HubRepo | None) -> None:
        """Head the panel with `repo` (None: nothing chosen); its files come by `show_files`."""
        self.table.set_files([], self._verdicts)
        self._file_selected(None)
        if repo is None:
            self.title.setText("")
            self.meta.setText("")
            self.status.setText("Choose a model on the left to see its files.")
            set_error(self.status, False)
            return
        self.title.setText(repo.repo)
        self.title.setToolTip(repo.repo)
        lines = [repo_line(repo)]
        if repo.description:
            lines.insert(0, repo.description)
        self.meta.setText("\n".join(lines))
        self.status.setText("Listing the files…")
        set_error(self.status, False)

    def show_files(self, files: list[HubFile]) -> None:
        self.table.set_files(files, self._verdicts)
        self.status.setText(
            "No GGUF model files in this repo." if not files else _files_line(len(files))
        )
        set_error(self.status, False)

    def show_error(self, message: str) -> None:
        self.table.set_files([], self._verdicts)
        self.status.setText(message)
        set_error(self.status, True)

    def set_verdict(self, key: FileKey, verdict: FitVerdict | str) -> None:
        self._verdicts[key] = verdict
        self.table.set_verdict(key, verdict)
        if self._selected is not None and file_key(self._selected) == key:
            self._file_selected(self._selected)

    def verdict(self, key: FileKey) -> FitVerdict | str | None:
        return self._verdicts.get(key)

    def _file_selected(self, hub_file: HubFile | None) -> None:
        self._selected = hub_file
        if hub_file is None:
            self.details.setText(DETAILS_HINT)
            return
        verdict = self._verdicts.get(file_key(hub_file))
        if verdict is None:
            self.details.setText(f"{hub_file.file}: reading its header…")
        elif isinstance(verdict, str):
            self.details.setText(f"{hub_file.file}: no verdict, {verdict}")
        else:
            self.details.setText(verdict_sentence(hub_file, verdict))


def _files_line(n: int) -> str:
    models = "1 model file" if n == 1 else f"{n} model files"
    return (
        f"{models}. This machine's verdict: whether the engine can load it here, the longest "
        "context one chat can have, and how many chats of a typical length fit at once."
    )
