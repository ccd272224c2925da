"""ServerControls: Engine ▸ Serve the engine — the OpenAI-compatible server (`kvscope serve`)
over the engine the window already runs.

External requests (an editor, an agent, Open WebUI pointed at the URL) join the chats in the
same batch and appear on the block map in their own colour, grouped by client ("api-{user}").
The action shows what the worker answered, not what was clicked: binding can fail (the port
is taken), and a rebuild of the engine stops the server. While it serves, the menu item names
the URL and port, "Copy the server URL" puts the URL on the clipboard, and a badge in the status
bar ("Serving on port 8000") stays as long as the server does; clicking it copies the URL too."""

from __future__ import annotations

import os
from collections.abc import Callable
from urllib.parse import urlsplit

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import QMainWindow, QToolButton, QWidget

from kvscope.app.core.engine_messages import ServerState
from kvscope.app.desktop.engine_thread.client import EngineClient

SERVE_HOST = "127.0.0.1"  # this machine only: the window never opens the engine to a network
SERVE_PORT_ENV = "KVSCOPE_SERVE_PORT"
DEFAULT_PORT = 8000
API_KEY_ENV = "KVSCOPE_API_KEY"
IDLE_TEXT = f"Serve the engine (OpenAI API on {SERVE_HOST})"


def serve_port() -> int:
    raw = os.environ.get(SERVE_PORT_ENV, "")
    return int(raw) if raw.isdecimal() and 0 < int(raw) < 65536 else DEFAULT_PORT


class ServerControls(QObject):
    def __init__(
        self,
        window: QWidget,
        client: EngineClient,
        show_error: Callable[[str, str], None],
        show_notice: Callable[[str], None],
    ) -> None:
        super().__init__(window)
        self._client = client
        self._show_error, self._show_notice = show_error, show_notice
        self.url = ""  # the base URL being served, "" when not serving
        self.action = QAction(IDLE_TEXT, window)
        self.action.setCheckable(True)
        self.action.setToolTip(
            f"Serve this engine at http://{SERVE_HOST}:{serve_port()}/v1 ({SERVE_PORT_ENV} sets "
            f"the port, {API_KEY_ENV} a key); its requests show on the map by client"
        )
        self.action.triggered.connect(self._clicked)
        self.copy_action = QAction("Copy the server URL", window)
        self.copy_action.setEnabled(False)
        self.copy_action.triggered.connect(self.copy_url)
        self.badge = QToolButton(autoRaise=True)
        self.badge.setObjectName("serverBadge")
        self.badge.clicked.connect(self.copy_url)
        self.badge.hide()
        if isinstance(window, QMainWindow):
            window.statusBar().addPermanentWidget(self.badge)
        client.server_state.connect(self._on_state)

    def actions(self) -> list[QAction]:
        return [self.action, self.copy_action]

    @property
    def port(self) -> int | None:
        """The port being served (None when not serving)."""
        return urlsplit(self.url).port if self.url else None

    def copy_url(self) -> None:
        if self.url:
            QGuiApplication.clipboard().setText(self.url)
            self._show_notice(f"Copied {self.url}")

    def _clicked(self, checked: bool) -> None:
        self.action.setChecked(bool(self.url))  # until the worker answers
        self.action.setEnabled(False)
        if checked:
            self._client.start_server(SERVE_HOST, serve_port(), os.environ.get(API_KEY_ENV, ""))
        else:
            self._client.stop_server()

    def _on_state(self, state: ServerState) -> None:
        self.action.setEnabled(True)
        self.url = state.url
        self.action.setChecked(bool(state.url))
        self.copy_action.setEnabled(bool(state.url))
        self.badge.setVisible(bool(state.url))
        if state.url:
            self.action.setText(f"Serving at {state.url} (port {self.port}): click to stop")
            self.badge.setText(f"Serving on port {self.port}")
            self.badge.setToolTip(f"OpenAI API at {state.url}; click to copy the URL")
        else:
            self.action.setText(IDLE_TEXT)
        if state.url:
            self._show_notice(f"Serving the engine at {state.url} (port {self.port})")
        elif state.error and "stopped" in state.error:
            self._show_notice(state.error)
        elif state.error:
            self._show_error("The server did not start", state.error)
        else:
            self._show_notice("The server stopped")
