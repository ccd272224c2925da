"""ConnectionList: the app's remote servers, one list the chat and the remote view both read.

Lives on the GUI thread. The window fills it from `kvscope --connect` and Engine ▸ Connect…;
whoever shows connections listens to `changed`."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from kvscope.app.remote.connection import Connection


class ConnectionList(QObject):
    changed = Signal()  # a connection was added or removed

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._items: list[Connection] = []

    def __iter__(self):
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def get(self, label: str) -> Connection | None:
        return next((c for c in self._items if c.label == label), None)

    def add(self, connection: Connection) -> None:
        """Add, or replace the one with the same label."""
        self._items = [c for c in self._items if c.label != connection.label] + [connection]
        self.changed.emit()

    def remove(self, label: str) -> None:
        kept = [c for c in self._items if c.label != label]
        if len(kept) != len(self._items):
            self._items = kept
            self.changed.emit()
