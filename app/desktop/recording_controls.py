"""RecordingControls: the window's Record / Stop recording button and Open recording… action.

Recording used to exist only as `kvscope record`. Here a click has the engine worker write the
KV events of whatever the user does next (chats, simulated users) to a session file in the data
folder; a second click stops it, and Open recording… scrubs through one on the maps
(app/desktop/replay_view.py). The button shows what the worker answered, not what was clicked: the
engine refuses to start while replies are in flight, and the window says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QFileDialog, QToolButton, QWidget

from app.core import paths
from app.core.engine_messages import RecordingState
from app.desktop.engine_client import EngineClient
from app.desktop.replay_view import ReplayDialog, open_recording

RECORD_TEXT = "● Record"
STOP_TEXT = "■ Stop recording"


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
        self.record_action.setToolTip(
            "Record the KV events of what happens next to a session file, to replay step by "
            "step (Engine ▸ Open recording…)"
        )
        self.record_action.triggered.connect(self._record_clicked)
        self.open_action = QAction("Open recording…", window)
        self.open_action.triggered.connect(lambda: self.open_recording())
        self.button = QToolButton(objectName="recordButton")
        self.button.setDefaultAction(self.record_action)
        client.recording.connect(self._on_recording)

    def actions(self) -> list[QAction]:
        return [self.record_action, self.open_action]

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
            self._show_notice(f"Recording the KV events to {state.recording}")
        elif was:
            self.last_recording = state.path
            self._show_notice(f"Recording saved to {state.path}: Engine ▸ Open recording…")

    def _show_state(self) -> None:
        self.record_action.setChecked(bool(self.recording_path))
        self.record_action.setText(STOP_TEXT if self.recording_path else RECORD_TEXT)

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
