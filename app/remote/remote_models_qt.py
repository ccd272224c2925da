"""RemoteModels: which models each connection serves, listed from /v1/models off the GUI thread.

The chat's model picker shows these. Each connection is listed when it is added (or replaced,
e.g. with another API key) and again on `refresh()`; a listing that fails keeps its error, shown
on the connection's entry. The threads only emit a queued signal back to this object.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Signal

from kvscope.app.remote.connection import Connection
from kvscope.app.remote.openai_http import OpenAIHttp, RemoteError

LIST_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ConnectionModels:
    connection: Connection
    state: str  # "listing" | "ok" | "error"
    models: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def label(self) -> str:
        return self.connection.label


class RemoteModels(QObject):
    changed = Signal()  # an entry was added, listed, failed or removed
    _listed = Signal(object, object, str)  # Connection, models (list) or None, error

    def __init__(self, connections, parent: QObject | None = None) -> None:
        """`connections`: the window's ConnectionList (iterable, with a `changed` signal)."""
        super().__init__(parent)
        self._connections = connections
        self._entries: dict[str, ConnectionModels] = {}
        self._listed.connect(self._on_listed)
        connections.changed.connect(self._sync)
        self._sync()

    def entries(self) -> list[ConnectionModels]:
        """In the connections' order."""
        return [self._entries[c.label] for c in self._connections if c.label in self._entries]

    def refresh(self) -> None:
        """List every connection again (a server may have come up or changed its models)."""
        for connection in self._connections:
            self._list(connection)
        self.changed.emit()

    def retry_failed(self) -> None:
        """List again the connections whose listing failed; they show their error meanwhile
        (the picker calls this as it drops down: nothing there changes under the pointer
        unless a server came back)."""
        for entry in list(self._entries.values()):
            if entry.state == "error":
                self._start(entry.connection)

    def _sync(self) -> None:
        current = {c.label: c for c in self._connections}
        for label in list(self._entries):
            if label not in current:
                del self._entries[label]
        for label, connection in current.items():
            entry = self._entries.get(label)
            if entry is None or entry.connection != connection:
                self._list(connection)
        self.changed.emit()

    def _list(self, connection: Connection) -> None:
        self._entries[connection.label] = ConnectionModels(connection, "listing")
        self._start(connection)

    def _start(self, connection: Connection) -> None:
        threading.Thread(
            target=self._fetch, args=(connection,), name="kvscope-list-models", daemon=True
        ).start()

    def _fetch(self, connection: Connection) -> None:
        try:
            with OpenAIHttp(connection, timeout=LIST_TIMEOUT_S) as http:
                models, error = http.models(), ""
        except RemoteError as e:
            models, error = None, str(e)
        try:
            self._listed.emit(connection, models, error)
        except RuntimeError:  # deleted meanwhile (the window closed)
            pass

    def _on_listed(self, connection: Connection, models, error: str) -> None:
        entry = self._entries.get(connection.label)
        if entry is None or entry.connection != connection:
            return  # removed or replaced while listing: a newer listing is on its way
        if models is None:
            listed = ConnectionModels(connection, "error", [], error)
        else:
            listed = ConnectionModels(connection, "ok", list(models))
        if listed != entry:
            self._entries[connection.label] = listed
            self.changed.emit()
