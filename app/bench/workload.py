"""The benchmark's requests: chat conversations from a workload file, each with its own budget."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvscope.app.core.paths import ASSETS_DIR
from kvscope.engine.input_file import read_input_file

DEFAULT_WORKLOAD = ASSETS_DIR / "chat_mixed.json"
# The bundled workload is 12 KB; a benchmark's requests are a few thousand chats at most.
MAX_WORKLOAD_BYTES = 16 << 20
MAX_TOKENS = 1 << 20  # a reply's budget: above any model's context


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
    chats = _chats(path)
    if num_requests is not None and not 1 <= num_requests <= len(chats):
        raise ValueError(f"num_requests {num_requests} must be in [1, {len(chats)}] for {path}")
    if max_tokens_cap is not None and max_tokens_cap < 1:
        raise ValueError(f"max_tokens_cap must be >= 1, got {max_tokens_cap}")
    requests = []
    for chat in chats[:num_requests]:
        max_tokens = chat["max_tokens"]
        if max_tokens_cap is not None:
            max_tokens = min(max_tokens, max_tokens_cap)
        requests.append(BenchRequest(messages=chat["messages"], max_tokens=max_tokens))
    return requests


def _chats(path: Path) -> list[dict]:
    """The file's "chat" list, each entry checked; ValueError naming the file and the entry."""
    data = read_input_file(path, "workload file", MAX_WORKLOAD_BYTES)
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested too deeply
        raise ValueError(f"{path} is not a JSON workload: {str(e)[:200]}") from None
    chats = doc.get("chat") if isinstance(doc, dict) else None
    if not isinstance(chats, list) or not chats:
        raise ValueError(f"{path} has no non-empty 'chat' list")
    for i, chat in enumerate(chats):
        if not _is_chat(chat):
            raise ValueError(
                f"{path}: chat {i} must be {{'messages': [{{'role': str, 'content': str}}, ...], "
                f"'max_tokens': an int in [1, {MAX_TOKENS:,}]}}"
            )
    return chats


def _is_chat(chat: object) -> bool:
    if not isinstance(chat, dict):
        return False
    messages, max_tokens = chat.get("messages"), chat.get("max_tokens")
    return (
        isinstance(messages, list)
        and bool(messages)
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in messages
        )
        and isinstance(max_tokens, int)
        and not isinstance(max_tokens, bool)
        and 1 <= max_tokens <= MAX_TOKENS
    )
