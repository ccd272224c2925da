"""PendingReply: a chat's reply in flight, and how it is kept once it ends.

A reply lives in memory only until it finishes or is stopped; then it becomes a stored message,
or, for Regenerate, joins the old reply's alternatives (the old one stays, hidden).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from kvscope.app.core.engine_messages import ReplyUpdate
from kvscope.app.desktop.chat.store import ChatStore, Message


class ReplyBackend(Protocol):
    """Who generates a reply: the engine's client, a RemoteChatClient or an UnreachableBackend."""

    def stop(self, request_id: str) -> None: ...


@dataclass
class PendingReply:
    """A reply in flight: lives in memory only until it finishes or is stopped."""

    request_id: str
    conversation_id: int
    texts: list[str] = field(default_factory=list)
    selected: int = 0
    update: ReplyUpdate | None = None
    client: ReplyBackend = field(kw_only=True)  # who generates it (always given)
    replaces: int | None = None  # Regenerate: the reply it joins as an alternative (hidden now)


def store_reply(store: ChatStore, pending: PendingReply, status: str) -> Message:
    """A new message, or Regenerate's reply added to the old one's alternatives."""
    texts, metrics = pending.texts or [""], pending.update.metrics() if pending.update else None
    if pending.replaces is not None:
        return store.add_alternatives(pending.replaces, texts, metrics, status, pending.selected)
    alternatives = texts if len(texts) > 1 else None
    return store.add_message(
        pending.conversation_id,
        "assistant",
        texts[pending.selected],
        status,
        alternatives,
        pending.selected,
        metrics,
    )
