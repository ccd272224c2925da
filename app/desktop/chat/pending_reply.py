"""PendingReply: a chat's reply in flight, and how it is kept once it ends.

A reply lives in memory only until it finishes or is stopped; then it becomes a stored message,
or, for Regenerate, joins the old reply's alternatives (the old one stays, hidden).
"""

from __future__ import annotations

import time
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
    sent_at: float = field(default_factory=time.time)  # Send, on the engine's clock

    def metrics(self) -> dict | None:
        """The reply's figures, its TTFT counted from Send: a question asked while the model
        loads waited for it, and the user waited too. `waited_s` is the part before the engine
        took the request (a model loading, the engine thread busy)."""
        if self.update is None:
            return None
        metrics = self.update.metrics()
        arrival = getattr(self.update, "arrival_time", None)  # a remote reply counts its own
        if arrival is not None and metrics.get("ttft_s") is not None:
            waited = max(0.0, arrival - self.sent_at)
            metrics["ttft_s"] += waited
            metrics["waited_s"] = waited
        return metrics


def store_reply(store: ChatStore, pending: PendingReply, status: str) -> Message:
    """A new message, or Regenerate's reply added to the old one's alternatives."""
    texts, metrics = pending.texts or [""], pending.metrics()
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
