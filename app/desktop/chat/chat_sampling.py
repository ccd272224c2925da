"""ChatSampling: a chat's own sampling settings and structured output, shown, stored and turned
into its replies' parameters.

Both live in the chat's sampling JSON (store.py): the SamplingSettings fields, and the structured
output beside them (structured_output.py); each write keeps the other. A chat without its own
settings (none yet, one from before, a bad entry) uses the app's defaults. Edits go to the chat
they were made in: a schema typed just before switching chats is stored with the one it was
typed for. The schema is checked by the engine's worker (`check_schema`), off the GUI thread.
The ChatController owns one and calls it when the chat on show changes and for every reply.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from kvscope.app.core.settings import SamplingSettings
from kvscope.app.desktop.chat.chat_view import ChatView
from kvscope.app.desktop.chat.store import ChatStore, Conversation
from kvscope.app.desktop.chat.structured_output import KEY as STRUCTURED_KEY
from kvscope.app.desktop.chat.structured_output import (
    StructuredOutput,
    parse_schema,
    reply_fields,
    with_structured,
)


class ChatSampling(QObject):
    save_failed = Signal(str)  # a line for the status bar: a setting could not be stored

    def __init__(
        self,
        store: ChatStore,
        chat: ChatView,
        engine_client,
        default_sampling: Callable[[], SamplingSettings],
        parent: QObject | None = None,
    ) -> None:
        """`engine_client`: the EngineClient, which checks schemas against the engine's model."""
        super().__init__(parent)
        self._store, self._chat = store, chat
        self._panel = chat.sampling
        self.field = chat.sampling.structured
        self._default_sampling = default_sampling
        self._shown: int | None = None  # the chat whose settings the panel shows
        self._panel.changed.connect(self._sampling_changed)
        self.field.changed.connect(self._structured_changed)
        self.field.shown_changed.connect(chat.set_json_replies)
        self.field.check_requested.connect(engine_client.check_schema)
        # A bound method of this GUI-thread object: the answer is queued here.
        engine_client.schema_checked.connect(self._schema_checked)

    def sampling_of(self, conversation: Conversation | None) -> SamplingSettings:
        """A chat's own sampling settings; the defaults for none, an older chat or a bad entry."""
        if conversation is None or conversation.sampling is None:
            return self._default_sampling()
        try:
            return SamplingSettings.from_dict(conversation.sampling)
        except ValueError:  # e.g. written by a newer KVScope with other limits
            return self._default_sampling()

    def show(self, conversation: Conversation | None) -> None:
        """Show a chat's settings (before its messages are drawn: they show as JSON or not)."""
        self.field.flush()  # typing still waiting goes to the chat it was typed in
        self._shown = conversation.id if conversation is not None else None
        self._panel.set_settings(self.sampling_of(conversation))
        structured = StructuredOutput.from_sampling(conversation.sampling if conversation else None)
        self.field.set_value(structured)
        self._chat.set_json_replies(structured.on, redraw=False)

    def for_new_chat(self, from_panel: bool) -> dict:
        """A new chat's sampling JSON: the app's defaults, or what the panel shows (no chat was
        open: the user may have set them, structured output too, for this first chat)."""
        if not from_panel:
            return self._default_sampling().params_kwargs()
        self.field.flush()
        return with_structured(self._panel.settings().params_kwargs(), self.field.value())

    def send_problem(self) -> str:
        """Why the chat on show cannot send now (its schema is not usable); "" when it can."""
        return self.field.problem()

    def reply_params(self, conversation: Conversation, on_engine: bool) -> dict:
        """A reply's parameters from the chat as stored: its sampling settings and, when on, its
        schema (`on_engine`: for this engine, else an OpenAI-compatible server). ValueError when
        the stored schema is not a JSON object (Send refuses before that)."""
        params = self.sampling_of(conversation).params_kwargs()
        structured = StructuredOutput.from_sampling(conversation.sampling)
        if structured.on:
            params.update(reply_fields(parse_schema(structured.schema), on_engine))
        return params

    def engine_changed(self) -> None:
        """Another model may read the schema differently: check it again."""
        self.field.recheck()

    def _sampling_changed(self, sampling: SamplingSettings) -> None:
        self._save(
            lambda stored: with_structured(
                sampling.params_kwargs(), StructuredOutput.from_sampling(stored)
            )
        )

    def _structured_changed(self, structured: StructuredOutput) -> None:
        self._save(lambda stored: with_structured(self._settings(stored), structured))

    def _settings(self, stored: dict | None) -> dict:
        """The SamplingSettings part of a chat's stored JSON (the defaults' when it has none)."""
        if stored is None:
            return self._default_sampling().params_kwargs()
        return {k: v for k, v in stored.items() if k != STRUCTURED_KEY}

    def _save(self, merged: Callable[[dict | None], dict]) -> None:
        cid = self._shown
        if cid is None:
            return  # no chat yet: the first one starts from what the panel shows
        try:
            stored = self._store.conversation(cid).sampling
            self._store.set_sampling(cid, merged(stored))
        except KeyError:
            return  # deleted meanwhile
        except (sqlite3.Error, OSError) as e:
            self.save_failed.emit(f"The chat's sampling settings could not be saved: {e}")

    def _schema_checked(self, ticket: int, error: object) -> None:
        self.field.show_check(ticket, error)
