"""RecordingControls: the window's Record / Stop recording button and Open recording… action.

Recording used to exist only as `kvscope record`. Here a click has the engine worker write the
KV events of whatever the user does next (chats, simulated users) to a session file in the data
folder; a second click stops it, and Open recording… scrubs through one on the maps
(app/desktop/recording/replay_view.py). The button shows what the worker answered, not what was
clicked: the engine refuses to start while replies are in flight, and the window says why. Where a
recording goes is said while it records (the action's tooltip) and after (a status-bar button
naming the file, its full path in the tooltip, that shows it in the file manager).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QUrl
from PySide6.QtGui import QAction, QDesktopServices
from PySide6.QtWidgets import QFileDialog, QMainWindow, QToolButton, QWidget

from kvscope.app.core import paths
from kvscope.app.core.engine_messages import RecordingState
from kvscope.app.desktop.engine_thread.client import EngineClient
from kvscope.app.desktop.recording.replay_view import ReplayDialog, open_recording
from kvscope.app.desktop.shortened_button import ShortenedToolButton

RECORD_TEXT = "● Record"
STOP_TEXT = "■ Stop recording"
RECORD_TIP = (
    "Record the KV events of what happens next to a session file, to replay step by step"
    " (Engine ▸ Open recording…)"
)


def recordings_dir() -> Path:
    folder = paths.data_dir() / "recordings"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def new_recording_path() -> Path:
    return recordings_dir() / time.strftime("session-%Y%m%d-%H%M%S.jsonl")


class RecordingControls(QObject):
    def __init__(
        self,
        window: QWidget,
        client: EngineClient,
        show_error: Callable[[str, str], None],
        show_notice: Callable[[str], None],
    ) -> None:
        super().__init__(window)
        self._window, self._client = window, client
        self._show_error, self._show_notice = show_error, show_notice
        self.recording_path = ""  # the file being written, "" when not recording
        self.last_recording = ""  # the newest finished one
        self.replay: ReplayDialog | None = None
        self.record_action = QAction(RECORD_TEXT, window, checkable=True)
        self.record_action.setToolTip(RECORD_TIP)
        self.record_action.triggered.connect(self._record_clicked)
        self.open_action = QAction("Open recording…", window)
        self.open_action.triggered.connect(lambda: self.open_recording())
        self.folder_action = QAction("Show recordings folder", window)
        self.folder_action.setToolTip(f"Open {recordings_dir()} in the file manager")
        self.folder_action.triggered.connect(lambda: self.show_in_folder(recordings_dir()))
        self.button = QToolButton()
        self.button.setObjectName("recordButton")
        self.button.setDefaultAction(self.record_action)
        # After a recording stops: where it went, until the next one starts.
        self.saved_button = ShortenedToolButton(objectName="recordingSaved", autoRaise=True)
        self.saved_button.clicked.connect(lambda: self.show_in_folder(self.last_recording))
        self.saved_button.hide()
        if isinstance(window, QMainWindow):
            window.statusBar().addPermanentWidget(self.saved_button)
        client.recording.connect(self._on_recording)

    def actions(self) -> list[QAction]:
        return [self.record_action, self.open_action, self.folder_action]

    def show_in_folder(self, path: str | Path) -> bool:
        """Open the folder holding `path` (or `path` itself, a folder) in the file manager."""
        path = Path(path)
        folder = path if path.is_dir() else path.parent
        return QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))

    def _record_clicked(self, checked: bool) -> None:
        # Shown as it was until the worker answers (it may refuse).
        self._show_state()
        self.record_action.setEnabled(False)
        if checked:
            self._client.start_recording(str(new_recording_path()))
        else:
            self._client.stop_recording()

    def _on_recording(self, state: RecordingState) -> None:
        self.record_action.setEnabled(True)
        was = self.recording_path
        self.recording_path = state.recording
        self._show_state()
        if state.error:
            self._show_error("Recording did not start", state.error)
        elif state.recording:
            self.saved_button.hide()
            self._show_notice(f"Recording the KV events to {state.recording}")
        elif was:
            self.last_recording = state.path
            self.saved_button.set_texts(
                f"Recording saved: {Path(state.path).name} · Show in folder",
                "Saved · Show in folder",  # where the bar has no room for the name
            )
            self.saved_button.setToolTip(
                f"{state.path}\nClick to show it in its folder; Engine ▸ Open recording… replays it"
            )
            self.saved_button.show()
            self._show_notice(f"Recording saved to {state.path}: Engine ▸ Open recording…")

    def _show_state(self) -> None:
        self.record_action.setChecked(bool(self.recording_path))
        self.record_action.setText(STOP_TEXT if self.recording_path else RECORD_TEXT)
        if self.recording_path:
            self.record_action.setToolTip(f"Recording to {self.recording_path}: click to stop")
        else:
            self.record_action.setToolTip(RECORD_TIP)

    def open_recording(self, path: str | Path | None = None) -> ReplayDialog | None:
        """Replay `path` (asked for when None); a file that cannot be opened says why."""
        if path is None:
            start = self.last_recording or str(recordings_dir())
            path, _ = QFileDialog.getOpenFileName(
                self._window, "Open a recording", start, "KVScope recordings (*.jsonl);;All (*)"
            )
            if not path:
                return None
        try:
            self.replay = open_recording(path, self._window)
        except (OSError, ValueError) as e:
            self._show_error("Cannot open this recording", str(e))
            return None
        return self.replay
