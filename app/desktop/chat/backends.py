"""ChatBackends: who answers a chat, the embedded engine or a model on a connected server.

A chat stores where it runs (app/desktop/chat/store.py `RemoteTarget`: a connection's label and
a model; none: this engine). This finds the client for it: the window's EngineClient, or one
RemoteChatClient per (connection, model), made on first use, whose answers are relayed through
this object's signals, so the ChatController hears every backend on the same two slots. A chat
whose connection is gone gets an UnreachableBackend, which has the same surface and fails every
reply with a sentence saying why.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from kvscope.app.desktop.chat.store import Conversation, RemoteTarget
from kvscope.app.remote.connection import Connection
from kvscope.app.remote.remote_chat_qt import RemoteChatClient


class UnreachableBackend(QObject):
    """The backend of a chat whose connection is gone: it answers nothing and says why, with the
    signals and methods of the clients that do answer."""

    request_output = Signal(object)  # never: nothing is generated
    request_failed = Signal(str, str)  # request id, `reason`
    context_usage = Signal(object)  # never: nothing is counted
    context_unknown = Signal(int, str)  # ticket, `short_reason`

    def __init__(self, reason: str, short_reason: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.reason = reason  # the chat's notice
        self.short_reason = short_reason  # the context meter's line

    def submit(self, request_id: str, system_prompt: str, turns, params, policy: str) -> None:
        self.request_failed.emit(request_id, self.reason)

    def stop(self, request_id: str) -> None:
        """Nothing runs: its submit failed at once."""

    def count_tokens(self, ticket: int, system_prompt: str, turns, max_tokens: int) -> None:
        self.context_unknown.emit(ticket, self.short_reason)


class ChatBackends(QObject):
    request_output = Signal(object)  # a remote reply's RemoteReplyUpdate
    request_failed = Signal(str, str)  # request id, message
    client_made = Signal(object)  # a new backend other than the engine (the meter listens)

    def __init__(self, engine_client, connections=None, parent: QObject | None = None) -> None:
        """`connections`: the window's ConnectionList; None: every chat runs on the engine."""
        super().__init__(parent)
        self.engine_client = engine_client
        self.connections = connections
        self._remote: dict[tuple[Connection, str], RemoteChatClient] = {}
        self._unreachable: dict[RemoteTarget, UnreachableBackend] = {}

    def connection_of(self, target: RemoteTarget) -> Connection | None:
        return self.connections.get(target.connection) if self.connections is not None else None

    def for_chat(self, conv: Conversation | None):
        """The engine's client, a RemoteChatClient, or an UnreachableBackend."""
        target = conv.remote if conv is not None else None
        if target is None:
            return self.engine_client
        connection = self.connection_of(target)
        if connection is None:
            return self._unreachable_for(target)
        key = (connection, target.model)  # a connection made again with another key: anew
        client = self._remote.get(key)
        if client is None:
            client = RemoteChatClient(connection, target.model, self)
            self._relay(client)
            self._remote[key] = client
        return client

    def notice_for(self, conv: Conversation | None, entries) -> str:
        """What the chat should say about where it runs: its connection is gone, or no longer
        lists its model (`entries`: RemoteModels.entries()); "" when all is well."""
        target = conv.remote if conv is not None else None
        if target is None:
            return ""
        if self.connection_of(target) is None:
            return self._unreachable_for(target).reason
        entry = next((e for e in entries if e.label == target.connection), None)
        if entry is not None and entry.state == "ok" and target.model not in entry.models:
            return (
                f"{target.connection} does not list {target.model} now (it serves "
                f"{', '.join(entry.models) or 'no models'}); pick another model below."
            )
        return ""

    def shutdown(self) -> None:
        """Stop every remote reply (their servers abort them) and let their threads end."""
        for client in self._remote.values():
            client.shutdown()

    def _unreachable_for(self, target: RemoteTarget) -> UnreachableBackend:
        backend = self._unreachable.get(target)
        if backend is None:
            backend = UnreachableBackend(
                f"This chat runs on {target.label}, and {target.connection} is not connected. "
                "Its history is kept: connect it again (Engine ▸ Connect…) or pick another "
                "model below.",
                f"{target.connection} is not connected",
                self,
            )
            self._relay(backend)
            self._unreachable[target] = backend
        return backend

    def _relay(self, backend) -> None:
        # Signal to signal: the relay runs on this object's (the GUI) thread.
        backend.request_output.connect(self.request_output)
        backend.request_failed.connect(self.request_failed)
        self.client_made.emit(backend)
