"""ChatBackendChoice: where a chat runs, this engine or a connected server's model.

A part of ChatController (app/desktop/chat/controller.py), apart because it is one concept: the
picker's choice stored with the chat, the client that counts its tokens, and the notice a chat
shows when its connection is gone or no longer lists its model (the chat keeps its history and
its choice, and says so instead of replying). ChatBackends finds the client. It reads the
controller's store, chat view, context meter, engine client, ChatBackends and RemoteModels.
"""

from __future__ import annotations

import sqlite3

from kvscope.app.desktop.chat.store import Conversation, RemoteTarget


class ChatBackendChoice:
    """Mixed into ChatController, the QObject that owns the attributes these methods read."""

    def set_remote(self, target: RemoteTarget | None) -> None:
        """The picker's choice for the chat on show: a connection's model, or None (this
        engine). With no chat open, the next new chat takes it."""
        if self.current_id is not None:
            try:
                self.store.set_remote(self.current_id, target)
            except (sqlite3.Error, OSError) as e:
                self.notice_raised.emit(f"The chat's model could not be saved: {e}")
                self._render_current()  # the picker shows the stored choice again
                return
        self.chat.backend_picker.set_current(target)
        self._refresh_backend_notice()
        self.context_meter.refresh()

    def _counter_for(self, conversation_id: int | None):
        if conversation_id is None:
            return self.client
        try:
            conv = self.store.conversation(conversation_id)
        except KeyError:  # deleted meanwhile
            return self.client
        backend = self.backends.for_chat(conv)
        return f"{conv.remote.connection} is not connected" if isinstance(backend, str) else backend

    def _show_backend_state(self, conv: Conversation | None) -> None:
        """Say so in the chat when its connection is gone or no longer lists its model."""
        entries = self.remote_models.entries() if self.remote_models is not None else []
        message = self.backends.notice_for(conv, entries)
        if message:
            self._backend_notice = message
            self.chat.show_notice(message)

    def _remote_models_changed(self) -> None:
        self.chat.backend_picker.set_entries(self.remote_models.entries())
        self._refresh_backend_notice()
        self.context_meter.refresh()

    def _refresh_backend_notice(self) -> None:
        if self._backend_notice and self.chat.notice.text() == self._backend_notice:
            self.chat.clear_notice()  # shown again below if it still holds
        self._backend_notice = ""
        cid = self.current_id
        self._show_backend_state(self.store.conversation(cid) if cid is not None else None)
