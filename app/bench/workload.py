"""The benchmark's requests: chat conversations from a workload file, each with its own budget."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvscope.app.core.paths import ASSETS_DIR

DEFAULT_WORKLOAD = ASSETS_DIR / "chat_mixed.json"


@dataclass
class BenchRequest:
    messages: list[dict]
    max_tokens: int


def load_chat_workload(
    path: Path | None = None,
    num_requests: int | None = None,
    max_tokens_cap: int | None = None,
) -> list[BenchRequest]:
    """The first `num_requests` entries of the file's "chat" list (all when None).

    `max_tokens_cap` shortens every request's budget, for quick runs and tests.
    """
    path = Path(path) if path is not None else DEFAULT_WORKLOAD
    if not path.is_file():
        raise FileNotFoundError(f"workload file does not exist: {path}")
    chats = json.loads(path.read_text()).get("chat")
    if not chats:
        raise ValueError(f"{path} has no non-empty 'chat' list")
    if num_requests is not None and not 1 <= num_requests <= len(chats):
        raise ValueError(f"num_requests {num_requests} must be in [1, {len(chats)}] for {path}")
    if max_tokens_cap is not None and max_tokens_cap < 1:
        raise ValueError(f"max_tokens_cap must be >= 1, got {max_tokens_cap}")
    requests = []
    for chat in chats[:num_requests]:
        max_tokens = int(chat["max_tokens"])
        if max_tokens_cap is not None:
            max_tokens = min(max_tokens, max_tokens_cap)
        requests.append(BenchRequest(messages=chat["messages"], max_tokens=max_tokens))
    return requests
