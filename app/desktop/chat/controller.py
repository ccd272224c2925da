"""ChatController: the conversations, the one on show, and the replies in flight.

It turns the chat widgets' requests (send, edit, stop, regenerate, switch chats) into store writes
and engine requests, and the engine's answers back into the chat view. A user message is committed
when sent; a reply is committed when it finishes or is stopped (partial text, marked stopped), so
a crash loses at most the reply in flight. Each chat keeps its own sampling settings (new chats
start from the app's defaults), and a reply always reads the chat as stored, after any edit still
waiting to be saved. The window builds the widgets and hands them here.

It owns its helpers and calls them: ChatSampling shows and stores each chat's sampling settings
and structured output and gives each reply its parameters (Send refuses while the chat's schema
cannot be used), ChatBackends finds who answers a chat (this engine, a RemoteChatClient for a
connected server's model, or an UnreachableBackend for a chat whose connection is gone; all with
the engine client's surface, so sending, stopping and regenerating are the same code),
BackendChoice stores the picker's choice and shows what the chat needs said about it, and
CompletionStyle gives a base model's replies their defaults.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer, Signal

from kvscope.app.core.engine_messages import ReplyUpdate
from kvscope.app.core.request_ids import conversation_group, conversation_request_id
from kvscope.app.core.settings import SamplingSettings
from kvscope.app.desktop.chat.backend_choice import BackendChoice
from kvscope.app.desktop.chat.backends import ChatBackends
from kvscope.app.desktop.chat.chat_sampling import ChatSampling
from kvscope.app.desktop.chat.chat_view import ChatView
from kvscope.app.desktop.chat.completion_style import CompletionStyle
from kvscope.app.desktop.chat.context_meter import ContextMeterFeed
from kvscope.app.desktop.chat.conversation_list import ConversationList
from kvscope.app.desktop.chat.markdown import plain_text
from kvscope.app.desktop.chat.pending_reply import PendingReply, store_reply
from kvscope.app.desktop.chat.store import ChatStore, Conversation
from kvscope.app.desktop.engine_thread.client import EngineClient

NEW_CHAT_TITLE = "New chat"
STREAM_REDRAW_MS = 80


class ChatController(QObject):
    """Lives on the GUI thread: the engine client's answers reach its bound methods queued."""

    reply_updated = Signal(object)  # ReplyUpdate of a reply in flight, on the GUI thread
    reply_finished = Signal(int, str)  # conversation id, status ("complete" | "stopped")
    reply_failed = Signal(int, str)  # conversation id, message
    in_flight_changed = Signal()  # a reply started or ended: `pending` changed
    group_labels_changed = Signal(dict)  # request group -> conversation title
    error_raised = Signal(str, str)  # title, message: for a dialog
    notice_raised = Signal(str)  # a line for the status bar

    def __init__(
        self,
        store: ChatStore,
        chat: ChatView,
        conversations: ConversationList,
        client: EngineClient,
        overflow_policy: Callable[[], str],
        default_sampling: Callable[[], SamplingSettings],
        parent: QObject | None = None,
        connections=None,
    ) -> None:
        """`connections`: the window's ConnectionList (app/remote/connections_qt.py); None:
        chats run on this engine only."""
        super().__init__(parent)
        self.store = store
        self.backends = ChatBackends(client, connections, self)
        self.completion_style = CompletionStyle(client)
        self.current_id: int | None = None
        self.backend_choice = BackendChoice(
            store,
            chat,
            self.backends,
            self.completion_style,
            lambda: self.current_id,
            connections,
            self,
        )
        self.backend_choice.save_failed.connect(self._choice_not_saved)
        self.chat = chat
        self.conversations = conversations
        self.client = client
        self._overflow_policy = overflow_policy
        self.sampling = ChatSampling(store, chat, client, default_sampling, self)
        self.sampling.save_failed.connect(self.notice_raised)
        self.pending: dict[int, PendingReply] = {}
        self._by_request: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._stream_timer = QTimer(self, singleShot=True, interval=STREAM_REDRAW_MS)
        self._stream_timer.timeout.connect(self._show_stream)

        conversations.new_requested.connect(self.new_chat_requested)
        conversations.conversation_selected.connect(self.open_conversation)
        conversations.rename_requested.connect(self.rename_conversation)
        conversations.delete_requested.connect(self.delete_conversation)
        chat.send_requested.connect(self._send_requested)
        chat.stop_requested.connect(self.stop_current)
        chat.regenerate_requested.connect(self.regenerate)
        chat.alternative_selected.connect(self._select_alternative)
        chat.system_prompt_changed.connect(self._system_prompt_changed)
        self.context_meter = ContextMeterFeed(
            chat.context_meter,
            chat,
            client,
            store.messages,
            lambda: self.current_id,
            self,
            client_for=self.backend_choice.counter_for,
        )
        self.backends.client_made.connect(self.context_meter.listen)
        self.backends.request_output.connect(self._on_output)
        self.backends.request_failed.connect(self._on_request_failed)
        self.backend_choice.changed.connect(self.context_meter.refresh)
        self.in_flight_changed.connect(self.context_meter.refresh)
        # Bound methods of this object only: a lambda would run in the worker's thread.
        client.request_output.connect(self._on_output)
        client.request_failed.connect(self._on_request_failed)
        client.engine_ready.connect(self._engine_changed)  # a base model? (CompletionStyle)

    def _engine_changed(self, info) -> None:
        """A (re)built engine: its model may be a base model now, or no longer."""
        self.completion_style.engine_changed(info)
        self.sampling.engine_changed()
        if self.current_id is not None:
            self.backend_choice.refresh_notice()

    def _choice_not_saved(self, message: str) -> None:
        self.notice_raised.emit(message)
        self._render_current()  # the picker shows the stored choice again

    # ---- conversations --------------------------------------------------------------------
    def new_conversation(self) -> int:
        """A new chat, with the app's default sampling settings (or, when no chat was open, the
        ones the panel shows: the user may have set them for this first chat)."""
        chosen = self.sampling.for_new_chat(from_panel=self.current_id is None)
        # The model on show carries over, while its connection is there.
        remote = self.chat.backend_picker.current_target()
        if remote is not None and self.backends.connection_of(remote) is None:
            remote = None
        conv = self.store.create_conversation(NEW_CHAT_TITLE, sampling=chosen, remote=remote)
        self.conversations.search.clear()
        self.conversations.refresh()
        self.open_conversation(conv.id)
        self.refresh_group_labels()
        self.chat.composer.setFocus()
        return conv.id

    def new_chat_requested(self) -> int:
        """New chat from the button or the menu: the open chat while it is untouched (no
        message, title or system prompt yet), so a second click makes no second empty chat."""
        cid = self.current_id
        if cid is not None and cid not in self.pending and not self.store.messages(cid):
            conv = self.store.conversation(cid)
            if conv.title == NEW_CHAT_TITLE and not conv.system_prompt.strip():
                self.chat.composer.setFocus()
                return cid
        return self.new_conversation()

    def open_conversation(self, conversation_id: int | None) -> None:
        self.current_id = conversation_id
        self.conversations.select(conversation_id)
        self._render_current()

    def _render_current(self) -> None:
        self.chat.flush_system_prompt()  # before reading the chat back, or the box goes stale
        cid = self.current_id
        conv = self.store.conversation(cid) if cid is not None else None
        self.sampling.show(conv)
        self.chat.set_conversation(conv, self._messages(conv.id) if conv else [])
        if conv is not None:
            self.chat.backend_picker.set_current(conv.remote)
        self.backend_choice.show_for(conv)
        self.context_meter.refresh()
        pending = self.pending.get(cid) if cid is not None else None
        self.chat.set_generating(pending is not None)
        if pending is not None:
            self.chat.start_pending()
            if pending.texts:
                metrics = pending.metrics()
                self.chat.update_pending(pending.texts, pending.selected, metrics)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self.store.rename(conversation_id, title)
        self.conversations.refresh()
        if conversation_id == self.current_id:
            self.chat.title.setText(title)
        self.refresh_group_labels()

    def delete_conversation(self, conversation_id: int) -> None:
        pending = self.pending.pop(conversation_id, None)
        if pending is not None:
            self._by_request.pop(pending.request_id, None)
            pending.client.stop(pending.request_id)
        self.store.delete_conversation(conversation_id)
        self.conversations.refresh()
        if conversation_id == self.current_id:
            self.open_conversation(next((c.id for c in self.store.conversations()), None))
        self.refresh_group_labels()

    def _system_prompt_changed(self, conversation_id: int, text: str) -> None:
        if any(c.id == conversation_id for c in self.store.conversations()):  # not deleted
            self.store.set_system_prompt(conversation_id, text)

    def sampling_of(self, conversation: Conversation | None) -> SamplingSettings:
        """A chat's own sampling settings; the defaults for none, an older chat or a bad entry."""
        return self.sampling.sampling_of(conversation)

    def refresh_group_labels(self) -> None:
        labels = {conversation_group(c.id): c.title for c in self.store.conversations()}
        self.group_labels_changed.emit(labels)

    # ---- sending --------------------------------------------------------------------------
    def send_message(self, text: str, conversation_id: int | None = None) -> int:
        """Commit a user message and start its reply; returns the conversation id."""
        cid = conversation_id if conversation_id is not None else self.current_id
        if cid is None:
            cid = self.new_conversation()
        if cid in self.pending:
            raise ValueError(f"conversation {cid} is still generating; stop it first")
        first = not self.store.messages(cid)
        self.store.add_message(cid, "user", text)
        if first and self.store.conversation(cid).title == NEW_CHAT_TITLE:
            self.store.rename(cid, _title_from(text))
            self.conversations.refresh()
            self.refresh_group_labels()
        self._start_reply(cid)
        return cid

    def _send_requested(self, text: str, editing: int) -> None:
        if self._schema_refused():
            return  # the text stays in the message box
        try:
            if editing >= 0:
                self.edit_and_resend(editing, text)
            else:
                self.send_message(text)
        except (sqlite3.Error, OSError) as e:  # a full or read-only disk: nothing is lost
            self.error_raised.emit(
                "The message could not be saved",
                f"{e}\n\nNothing was sent; your text is still in the message box.",
            )
            return
        except ValueError as e:  # e.g. still generating
            self.error_raised.emit("The message was not sent", str(e))
            return
        self.chat.message_sent()

    def edit_and_resend(self, message_id: int, text: str) -> None:
        """Replace a user message's text, drop everything after it, and reply anew."""
        msg = self.store.edit_and_truncate(message_id, text)
        self._start_reply(msg.conversation_id)

    def regenerate(self, conversation_id: int | None = None) -> None:
        """Redo the last reply (or retry a user message whose reply failed)."""
        cid = conversation_id if conversation_id is not None else self.current_id
        if cid is None or cid in self.pending:
            return
        if cid == self.current_id and self._schema_refused():
            return
        messages = self.store.messages(cid)
        if messages:  # the old reply stays, hidden, and becomes an alternative of the new one
            self._start_reply(cid, messages[-1].id if messages[-1].role == "assistant" else None)

    def _schema_refused(self) -> bool:
        """The chat on show has structured output on with a schema that cannot be used: say so
        beside the schema, which is opened, and send nothing."""
        problem = self.sampling.send_problem()
        if problem:
            self.chat.sampling_toggle.setChecked(True)
            self.chat.show_notice(f"Not sent: {problem} (Sampling ▸ Structured output)")
            self.chat.sampling.structured.editor.setFocus()
            self.chat.sampling_scroll.show_structured()
        return bool(problem)

    def _messages(self, cid: int) -> list:
        """The chat's messages less a reply being regenerated: it is not in the context."""
        replaced = getattr(self.pending.get(cid), "replaces", None)
        return [m for m in self.store.messages(cid) if m.id != replaced]

    def stop(self, conversation_id: int) -> None:
        pending = self.pending.get(conversation_id)
        if pending is not None:
            pending.client.stop(pending.request_id)

    def stop_current(self) -> None:
        if self.current_id is not None:
            self.stop(self.current_id)

    def request_id_of(self, conversation_id: int) -> str | None:
        pending = self.pending.get(conversation_id)
        return pending.request_id if pending else None

    def _start_reply(self, cid: int, replaces: int | None = None) -> None:
        self.chat.flush_system_prompt()  # an edit typed just before Send goes with this reply
        conv = self.store.conversation(cid)
        request_id = conversation_request_id(cid, next(self._ids))
        backend = self.backends.for_chat(conv)
        # First: a schema that is not JSON raises here, before the reply is in flight.
        sampling = self.sampling.reply_params(conv, on_engine=backend is self.client)
        params = self.completion_style.reply_params(conv, backend, sampling)
        self.pending[cid] = PendingReply(request_id, cid, client=backend, replaces=replaces)
        turns = [{"role": m.role, "content": m.content} for m in self._messages(cid)]
        self._by_request[request_id] = cid
        self.conversations.set_generating(cid, True)
        if cid == self.current_id:
            self._render_current()
        self.in_flight_changed.emit()
        # Last: an UnreachableBackend fails the reply at once, through _on_request_failed.
        backend.submit(request_id, conv.system_prompt, turns, params, self._overflow_policy())

    # ---- the engine's answers -------------------------------------------------------------
    def _on_output(self, update: ReplyUpdate) -> None:
        cid = self._by_request.get(update.request_id)
        pending = self.pending.get(cid) if cid is not None else None
        if pending is None or pending.request_id != update.request_id:
            return  # its conversation was deleted meanwhile
        pending.texts, pending.update = update.texts, update
        self.reply_updated.emit(update)
        if update.finished:
            self._finish_reply(pending)
        elif cid == self.current_id and not self._stream_timer.isActive():
            # Redraw the streaming bubble at most every STREAM_REDRAW_MS, with the newest text.
            self._stream_timer.start()

    def _show_stream(self) -> None:
        pending = self.pending.get(self.current_id) if self.current_id is not None else None
        if pending is not None and pending.update is not None:
            self.chat.update_pending(pending.texts, pending.selected, pending.metrics())

    def _finish_reply(self, pending: PendingReply) -> None:
        update = pending.update
        stopped = update is None or "abort" in update.finish_reasons
        status = "stopped" if stopped else "complete"
        texts = pending.texts or [""]
        try:
            message = store_reply(self.store, pending, status)
        except (sqlite3.Error, OSError) as e:
            # Not stored, so not shown as stored: the chat leaves "generating" (Stop and Send
            # work again) and the text is handed to the user in the error.
            self._forget(pending)
            self.error_raised.emit(
                "The reply could not be saved",
                f"{e}\n\nThe reply was:\n\n{texts[pending.selected]}",
            )
            self.reply_failed.emit(pending.conversation_id, str(e))
            return
        if pending.conversation_id == self.current_id:
            self.chat.finish_pending(message)
        self._forget(pending, redraw=False)
        self.reply_finished.emit(pending.conversation_id, status)

    def _on_request_failed(self, request_id: str, message: str) -> None:
        cid = self._by_request.get(request_id)
        pending = self.pending.get(cid) if cid is not None else None
        if pending is None or pending.request_id != request_id:
            return
        self._forget(pending)
        if cid == self.current_id:
            self.chat.show_notice(message)
        self.notice_raised.emit(f"Reply failed: {message}")
        self.reply_failed.emit(cid, message)

    def _forget(self, pending: PendingReply, redraw: bool = True) -> None:
        cid = pending.conversation_id
        self.pending.pop(cid, None)
        self._by_request.pop(pending.request_id, None)
        self.conversations.set_generating(cid, False)
        if cid == self.current_id:
            if redraw:
                self._render_current()
            else:
                self.chat.set_generating(False)
        self.in_flight_changed.emit()

    def _select_alternative(self, message_id: int, index: int) -> None:
        if message_id < 0:
            cid = self.current_id
            pending = self.pending.get(cid) if cid is not None else None
            if pending is not None:
                pending.selected = index
                metrics = pending.metrics()
                self.chat.update_pending(pending.texts, index, metrics)
            return
        self.store.select_alternative(message_id, index)
        self._render_current()

    def keep_in_flight_as_stopped(self) -> None:
        """On close: replies in flight are kept as far as they got, marked stopped."""
        for pending in list(self.pending.values()):
            if pending.update is not None:
                store_reply(self.store, pending, "stopped")
        self.pending.clear()
        self._by_request.clear()
        self.backends.shutdown()  # remote streams close: their servers abort them


def _title_from(text: str, limit: int = 40) -> str:
    line = plain_text(text) or " ".join(text.split())  # "# **Hi**" is titled "Hi"
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"
