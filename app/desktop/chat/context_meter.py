"""The context meter under the chat: how much of the context the chat takes if sent now.

LM Studio and Jan users expect to see, while typing, how close a chat is to the model's
context. The count must be the engine's own (chat template + tokenizer), and the engine lives on
the worker thread, so the feed asks the worker (`EngineClient.count_tokens`) once typing pauses
and shows only the newest answer; the GUI thread never tokenizes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Protocol

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QLabel, QWidget

from kvscope.app.core.engine_messages import ContextUsage

COUNT_DEBOUNCE_MS = 300  # one count per pause in typing, not one per key
NEAR_SHARE = 0.8  # warn once prompt + the reply's room take this share of the context
LEVEL_COLOURS = {"near": "#c28a12", "over": "#d9534f"}  # readable on dark and light themes


def usage_level(usage: ContextUsage) -> str:
    """'ok', 'near' (most of the context taken) or 'over' (the reply would not fit)."""
    needed = usage.used + usage.reserve
    if needed > usage.limit:
        return "over"
    return "near" if needed > NEAR_SHARE * usage.limit else "ok"


class TokenCounter(Protocol):
    """Who counts a chat's tokens: the engine's client, a RemoteChatClient or an
    UnreachableBackend. The answer comes later, by ticket, on the client's signals."""

    def count_tokens(
        self, ticket: int, system_prompt: str, turns: list[dict[str, str]], max_tokens: int
    ) -> None: ...


class ContextMeter(QLabel):
    """'1,234 / 2,048 tokens', coloured as the chat nears or passes the context."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("contextMeter")
        self.setToolTip("Tokens this chat takes of the model's context, counted once a model runs")
        self.setProperty("level", "ok")

    def show_usage(self, usage: ContextUsage) -> None:
        level = usage_level(usage)
        self.setText(f"{usage.used:,} / {usage.limit:,} tokens")
        self.setProperty("level", level)
        colour = LEVEL_COLOURS.get(level)
        self.setStyleSheet(f"color: {colour}; font-weight: bold;" if colour else "")
        advice = {
            "ok": "",
            "near": "\nThe context is nearly full.",
            "over": "\nThis does not fit: the reply would be refused or the oldest turns left "
            "out (Settings). Start a new chat or shorten the message.",
        }[level]
        self.setToolTip(
            f"System prompt + history + your draft, as the model sees it: {usage.used:,} tokens "
            f"of {usage.limit:,} (max_model_len, or what the KV pool holds if less). The reply "
            f"needs room for up to {usage.reserve:,} more." + advice
        )

    def show_unknown(self, why: str) -> None:
        """A remote chat whose server cannot count (no /tokenize) or is not connected."""
        self.setText("tokens: unknown")
        self.setProperty("level", "ok")
        self.setStyleSheet("")
        self.setToolTip(f"The context this chat takes is not known here: {why}")


class ContextMeterFeed(QObject):
    """Asks the worker for the current chat's count when something that changes it settles.

    `chat` is the ChatView (its system prompt box, composer, sampling panel and edit state);
    `messages_of(conversation_id)` the stored turns; `current_id()` the chat on show.
    `client_for(conversation_id)`, when given, names who counts for that chat (the engine's
    client, a RemoteChatClient, or an UnreachableBackend that answers that nobody can);
    `listen(client)` hears a further client's answers.
    """

    def __init__(
        self,
        meter: ContextMeter,
        chat,
        client,
        messages_of: Callable[[int], list],
        current_id: Callable[[], int | None],
        parent: QObject | None = None,
        client_for: Callable[[int | None], TokenCounter] | None = None,
    ) -> None:
        super().__init__(parent)
        self._meter, self._chat, self._client = meter, chat, client
        self._client_for = client_for
        self._messages_of, self._current_id = messages_of, current_id
        self._tickets = itertools.count(1)
        self._latest = 0
        self._timer = QTimer(self, singleShot=True, interval=COUNT_DEBOUNCE_MS)
        self._timer.timeout.connect(self._ask)
        chat.composer.textChanged.connect(self.refresh)
        chat.system_prompt.textChanged.connect(self.refresh)
        chat.sampling.changed.connect(self._sampling_changed)
        # Bound methods of this object only: a lambda would run in the worker's thread.
        client.context_usage.connect(self._on_usage)
        client.engine_ready.connect(self._on_engine_ready)

    def listen(self, client) -> None:
        """Hear the counts of another client (a remote chat's); answers go by ticket."""
        client.context_usage.connect(self._on_usage)
        client.context_unknown.connect(self._on_unknown)

    def refresh(self) -> None:
        """Count again once things settle (restarts the debounce)."""
        self._timer.start()

    def _sampling_changed(self, _settings) -> None:
        self.refresh()  # max_tokens sets the room the reply needs

    def _on_engine_ready(self, _info) -> None:
        self.refresh()  # a rebuild may change max_model_len

    def _ask(self) -> None:
        if not self._meter.isVisible():  # the window closed (its store with it)
            return
        cid = self._current_id()
        messages = self._messages_of(cid) if cid is not None else []
        editing = self._chat.editing_message_id()
        if editing >= 0:  # sending replaces the edited message and everything after it
            messages = list(itertools.takewhile(lambda m: m.id != editing, messages))
        turns = [{"role": m.role, "content": m.content} for m in messages]
        draft = self._chat.composer.toPlainText().strip()
        if draft:
            turns.append({"role": "user", "content": draft})
        self._latest = next(self._tickets)
        max_tokens = self._chat.sampling.settings().max_tokens
        system_prompt = self._chat.system_prompt.toPlainText()
        client = self._client_for(cid) if self._client_for is not None else self._client
        client.count_tokens(self._latest, system_prompt, turns, max_tokens)

    def _on_usage(self, usage: ContextUsage) -> None:
        if usage.ticket == self._latest:  # an older answer would show a stale count
            self._meter.show_usage(usage)

    def _on_unknown(self, ticket: int, why: str) -> None:
        if ticket == self._latest:
            self._meter.show_unknown(why)
