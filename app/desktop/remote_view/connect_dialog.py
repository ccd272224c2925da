"""Engine ▸ Connect…: the dialog that adds a remote server to the window's ConnectionList.

The fields are parse_connection's (app/remote/connection.py); its ConnectionSpecError is shown
under the form and the dialog stays open until what was typed is usable."""

from __future__ import annotations

from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QMainWindow,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.remote.connection import Connection, ConnectionSpecError, parse_connection
from kvscope.app.remote.connections_qt import ConnectionList

ERROR_STYLE = "color: #E8354F;"
HELP = (
    "An OpenAI-compatible server (vLLM, SGLang, <code>kvscope serve</code>). The KV events "
    "endpoint is where the server publishes them (vLLM: <code>--kv-events-config "
    '\'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": '
    '"tcp://*:5557", "replay_endpoint": "tcp://*:5558"}\'</code>); without it only '
    "/metrics is shown. The hash seed is the server's PYTHONHASHSEED, needed to reproduce "
    "vLLM's block hashes for routing; without it blocks are matched by token ids."
)


class ConnectDialog(QDialog):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Connect to a server")
        self.setObjectName("connectDialog")
        self.result_connection: Connection | None = None
        self.url = QLineEdit(placeholderText="http://127.0.0.1:8000")
        self.kv_events = QLineEdit(placeholderText="tcp://127.0.0.1:5557 (optional)")
        self.kv_replay = QLineEdit(placeholderText="tcp://127.0.0.1:5558 (optional)")
        self.api_key = QLineEdit(placeholderText="optional")
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.name = QLineEdit(placeholderText="default: host:port")
        self.hash_seed = QLineEdit(placeholderText="vLLM's PYTHONHASHSEED (optional)")
        form = QFormLayout()
        form.addRow("Server URL", self.url)
        form.addRow("KV events endpoint", self.kv_events)
        form.addRow("Replay endpoint", self.kv_replay)
        form.addRow("API key", self.api_key)
        form.addRow("Name", self.name)
        form.addRow("vLLM hash seed", self.hash_seed)
        help_label = QLabel(HELP, wordWrap=True)
        help_label.setObjectName("connectHelp")
        help_label.setStyleSheet("color: #8C94A3; font-size: 11px;")
        self.error = QLabel(wordWrap=True)
        self.error.setObjectName("errorText")
        self.error.setStyleSheet(ERROR_STYLE)
        self.error.setVisible(False)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Connect")
        buttons.accepted.connect(self._accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(help_label)
        layout.addWidget(self.error)
        layout.addWidget(buttons)
        self.setMinimumWidth(480)
        for edit in (self.url, self.kv_events, self.kv_replay):
            edit.textEdited.connect(lambda _text: self.error.setVisible(False))

    def connection(self) -> Connection:
        """What the form says, checked; raises ConnectionSpecError naming the bad field."""
        return parse_connection(
            self.url.text(),
            kv_events=self.kv_events.text(),
            kv_replay=self.kv_replay.text(),
            api_key=self.api_key.text(),
            name=self.name.text(),
            hash_seed=self.hash_seed.text().strip() or None,
        )

    def _accept(self) -> None:
        try:
            self.result_connection = self.connection()
        except ConnectionSpecError as e:
            self.error.setText(str(e))
            self.error.setVisible(True)
            return
        self.accept()


def add_connect_action(window: QMainWindow, connections: ConnectionList) -> QAction:
    """Put "Connect to a server…" in the window's Engine menu; accepting the dialog adds the
    connection to `connections` (which the remote view follows)."""
    from kvscope.app.desktop.window_menu import add_engine_actions

    action = QAction("Connect…", window)
    action.setObjectName("connectAction")
    action.setToolTip("Follow a vLLM / SGLang / kvscope serve server's KV cache and metrics")

    def open_dialog() -> None:
        dialog = ConnectDialog(window)
        if dialog.exec() == QDialog.DialogCode.Accepted and dialog.result_connection:
            connections.add(dialog.result_connection)

    action.triggered.connect(open_dialog)
    add_engine_actions(window, [action])
    return action
