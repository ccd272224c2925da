"""BackendChoice: where a chat runs, this engine or a connected server's model, and what the chat
says about it.

The picker's choice is stored with the chat. The client that counts a chat's tokens is the one
that would answer it (ChatBackends finds it). A chat whose connection is gone or no longer lists
its model keeps its history and its choice, and shows a notice instead of replying; so does a
chat on a base model (CompletionStyle's notice). The controller owns one and calls it when the
chat on show changes; `changed` tells it to count the context again.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from kvscope.app.desktop.chat.backends import ChatBackends
from kvscope.app.desktop.chat.chat_view import ChatView
from kvscope.app.desktop.chat.completion_style import CompletionStyle
from kvscope.app.desktop.chat.store import ChatStore, Conversation, RemoteTarget
from kvscope.app.remote.remote_models_qt import RemoteModels


class BackendChoice(QObject):
    changed = Signal()  # the choice or the models on offer changed: count the context again
    save_failed = Signal(str)  # the choice could not be stored (the picker shows the old one)

    def __init__(
        self,
        store: ChatStore,
        chat: ChatView,
        backends: ChatBackends,
        completion_style: CompletionStyle,
        current_id: Callable[[], int | None],
        connections=None,
        parent: QObject | None = None,
    ) -> None:
        """`connections`: the window's ConnectionList; None: chats run on this engine only."""
        super().__init__(parent)
        self._store, self._chat, self._backends = store, chat, backends
        self._completion_style = completion_style
        self._current_id = current_id
        self._notice = ""  # the notice this shows in the chat, "" when none
        self.remote_models: RemoteModels | None = None
        if connections is not None:
            self.remote_models = RemoteModels(connections, self)
            self.remote_models.changed.connect(self._remote_models_changed)
            chat.backend_picker.opening.connect(self.remote_models.retry_failed)
            self._remote_models_changed()
        chat.backend_picker.target_chosen.connect(self.set_remote)

    def set_remote(self, target: RemoteTarget | None) -> None:
        """The picker's choice for the chat on show: a connection's model, or None (this
        engine). With no chat open, the next new chat takes it."""
        cid = self._current_id()
        if cid is not None:
            try:
                self._store.set_remote(cid, target)
            except (sqlite3.Error, OSError) as e:
                self.save_failed.emit(f"The chat's model could not be saved: {e}")
                return
        self._chat.backend_picker.set_current(target)
        self.refresh_notice()
        self.changed.emit()

    def counter_for(self, conversation_id: int | None):
        """Who counts a chat's tokens: the client that would answer it."""
        try:
            conv = (
                self._store.conversation(conversation_id) if conversation_id is not None else None
            )
        except KeyError:  # deleted meanwhile
            conv = None
        return self._backends.for_chat(conv)

    def show_for(self, conv: Conversation | None) -> None:
        """The chat on show changed: its notice, if it needs one."""
        self._notice = ""
        self._show_state(conv)

    def refresh_notice(self) -> None:
        """Say again what the chat on show needs said (a connection or the engine changed)."""
        if self._notice and self._chat.notice.text() == self._notice:
            self._chat.clear_notice()  # shown again below if it still holds
        self._notice = ""
        cid = self._current_id()
        self._show_state(self._store.conversation(cid) if cid is not None else None)

    def _show_state(self, conv: Conversation | None) -> None:
        entries = self.remote_models.entries() if self.remote_models is not None else []
        message = self._backends.notice_for(conv, entries)
        if not message and conv is not None:
            message = self._completion_style.notice_for(conv, self._backends.for_chat(conv))
        if message:
            self._notice = message
            self._chat.show_notice(message)

    def _remote_models_changed(self) -> None:
        assert self.remote_models is not None  # connected only once there are RemoteModels
        self._chat.backend_picker.set_entries(self.remote_models.entries())
        self.refresh_notice()
        self.changed.emit()
