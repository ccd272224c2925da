"""DownloadRow: one download in the downloads panel: its file, a progress bar, the bytes, speed
and time left, and the buttons its state allows.

Downloading: Pause and Cancel. Paused: Resume and Cancel. Failed: the reason in words, Retry
(a new pull resumes from the verified bytes kept) and Remove. Done: Open (loads it into the
engine, as Engine ▸ Model and engine… does) and Remove. Cancelled: Remove. A download an
earlier session left unfinished starts as "stopped", with Resume.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QWidget,
)

from kvscope.app.desktop.elided_label import ElidedLabel
from kvscope.app.desktop.get_model.download_task import DownloadTask
from kvscope.app.desktop.get_model.look import bold, muted
from kvscope.app.desktop.get_model.texts import progress_line, size

if TYPE_CHECKING:
    from kvscope.app.core.hub.pull import PullProgress

BAR_STEPS = 1000  # QProgressBar holds an int: a file's bytes would overflow it
STATE_WORDS = {
    "starting": "starting",
    "verifying": "checking",
    "downloading": "downloading",
    "paused": "paused",
    "done": "done",
    "failed": "failed",
    "cancelled": "cancelled",
    "stopped": "stopped",
}


class DownloadRow(QFrame):
    open_requested = Signal(str)  # the local path of the downloaded model
    remove_requested = Signal()
    cancel_stopped = Signal()  # Cancel of a download left from an earlier session (no pull runs)

    def __init__(self, task: DownloadTask, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("downloadRow")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.task = task
        self.state = "starting"
        self.path: str | None = None
        self.error_message = ""
        self._paused_by_user = False
        self.name = ElidedLabel(f"{task.repo} · {task.file}", elide=Qt.TextElideMode.ElideMiddle)
        bold(self.name)
        self.name.setToolTip(f"{task.repo}\n{task.file}")
        self.state_label = QLabel(STATE_WORDS["starting"])
        self.state_label.setObjectName("downloadState")
        self.bar = QProgressBar(minimum=0, maximum=BAR_STEPS, textVisible=False)
        self.bar.setMaximumHeight(10)
        self.detail = muted(ElidedLabel("asking the hub for the file list…"))
        self.error = QLabel(wordWrap=True)
        self.error.setObjectName("errorText")
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error.setVisible(False)
        self.pause_button = QPushButton("Pause")
        self.resume_button = QPushButton("Resume")
        self.retry_button = QPushButton("Retry")
        self.cancel_button = QPushButton("Cancel")
        self.open_button = QPushButton("Open")
        self.open_button.setToolTip("Load this model into the engine")
        self.remove_button = QPushButton("Remove")
        self.remove_button.setToolTip("Take this row off the list (the file stays on disk)")
        buttons = QHBoxLayout()
        buttons.setSpacing(4)
        for button in self._buttons():
            buttons.addWidget(button)
        grid = QGridLayout(self)
        grid.setContentsMargins(8, 6, 8, 6)
        grid.setVerticalSpacing(3)
        grid.addWidget(self.name, 0, 0)
        grid.addWidget(self.state_label, 0, 1, Qt.AlignmentFlag.AlignRight)
        grid.addWidget(self.bar, 1, 0, 1, 2)
        grid.addWidget(self.detail, 2, 0)
        grid.addLayout(buttons, 2, 1)
        grid.addWidget(self.error, 3, 0, 1, 2)
        grid.setColumnStretch(0, 1)

        self.pause_button.clicked.connect(self.pause)
        self.resume_button.clicked.connect(self.resume)
        self.retry_button.clicked.connect(self.retry)
        self.cancel_button.clicked.connect(self.cancel)
        self.open_button.clicked.connect(lambda: self.open_requested.emit(self.path or ""))
        self.remove_button.clicked.connect(self.remove_requested)
        task.progressed.connect(self._progressed)
        task.finished.connect(self._finished)
        task.failed.connect(self._failed)
        task.cancelled.connect(self._cancelled)
        self._show_state("starting")

    # ---- the user's buttons ---------------------------------------------------------------
    def pause(self) -> None:
        self._paused_by_user = True
        self.task.pause()
        self._show_state("paused")  # at once: the pull confirms when its read stops

    def resume(self) -> None:
        self._paused_by_user = False
        if self.state == "stopped":
            self.task.start()
        else:
            self.task.resume()
        self._show_state("downloading")

    def retry(self) -> None:
        self.error.setVisible(False)
        self.task.start()
        self._show_state("starting")

    def cancel(self) -> None:
        if self.state == "stopped":
            self.cancel_stopped.emit()
            self._cancelled()
        else:
            self.task.cancel()

    # ---- what the download reports ----------------------------------------------------------
    def show_stopped(self, done_bytes: int, total_bytes: int) -> None:
        """A partial download from an earlier session: how far it got; Resume goes on."""
        self._set_bar(done_bytes, total_bytes)
        self.detail.setText(
            f"{size(done_bytes)} of {size(total_bytes)} · stopped when the app last closed"
        )
        self._show_state("stopped")

    def _progressed(self, progress: PullProgress) -> None:
        if self.state in ("done", "failed", "cancelled"):
            return  # a late report after the end
        self._set_bar(progress.done_bytes, progress.total_bytes)
        self.detail.setText(progress_line(progress))
        self.detail.setToolTip(progress_line(progress))
        # Reports queued before the user's last Pause or Resume reached the pull say the old
        # state: the button pressed wins until the pull reports the same.
        stale = "downloading" if self._paused_by_user else "paused"
        # The end is shown by the task's own signals: "done" only with the path to open.
        if progress.state not in ("done", "failed", "cancelled", stale):
            self._show_state(progress.state)

    def _finished(self, path: str) -> None:
        self.path = path
        self.bar.setValue(BAR_STEPS)
        self._show_state("done")

    def _failed(self, message: str) -> None:
        self.error_message = message
        self.error.setText(message)
        self.error.setVisible(True)
        self._show_state("failed")

    def _cancelled(self) -> None:
        self.bar.setValue(0)
        self.detail.setText("cancelled: the partial download was deleted")
        self._show_state("cancelled")

    # ---- drawing ----------------------------------------------------------------------------
    def _set_bar(self, done: int, total: int) -> None:
        self.bar.setValue(int(BAR_STEPS * done / total) if total else 0)

    def _show_state(self, state: str) -> None:
        self.state = state
        self.state_label.setText(STATE_WORDS.get(state, state))
        running = state in ("starting", "verifying", "downloading")
        self.pause_button.setVisible(running)
        self.resume_button.setVisible(state in ("paused", "stopped"))
        self.retry_button.setVisible(state == "failed")
        self.cancel_button.setVisible(running or state in ("paused", "stopped"))
        self.open_button.setVisible(state == "done")
        self.remove_button.setVisible(state in ("done", "failed", "cancelled"))

    def _buttons(self) -> list[QPushButton]:
        return [
            self.pause_button,
            self.resume_button,
            self.retry_button,
            self.cancel_button,
            self.open_button,
            self.remove_button,
        ]
