"""Fitting a conversation into the context before its reply starts, under the overflow policy.

Runs on the worker thread (it tokenizes with the engine's tokenizer): a conversation that does
not fit is refused with a message the chat shows, or loses its oldest turns, never the newest.
"""

from __future__ import annotations


class ContextOverflow(ValueError):
    """A conversation does not fit the context under the chosen overflow policy."""


def reply_reserve(max_seq_len: int, max_tokens: int) -> int:
    """The context a reply must find free: its max_tokens, but at most a quarter of it."""
    return min(max_tokens, max(1, max_seq_len // 4))


def prompt_ids(engine, system_prompt: str, turns: list[dict]) -> list[int]:
    """The prompt's token ids as the engine builds them: the chat template, then the tokenizer."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
    return engine.tokenize(engine.apply_chat_template(system + turns))[1]


def fit_conversation(
    engine, system_prompt: str, turns: list[dict], reserve: int, policy: str
) -> tuple[list[int], int]:
    """Prompt token ids for the conversation, and how many oldest turns were dropped to fit.

    A conversation fits when its prompt leaves `reserve` tokens of context for the reply.
    "stop" raises ContextOverflow; "drop_oldest" removes whole turns (a user message and the
    replies after it) from the start, never the system prompt or the newest user message.
    """
    limit = engine.max_seq_len  # max_model_len, or less when the pool is smaller
    ids = prompt_ids(engine, system_prompt, turns)
    dropped = 0
    while len(ids) + reserve > limit:
        starts = [i for i, m in enumerate(turns) if m["role"] == "user"]
        if policy != "drop_oldest" or len(starts) < 2:
            what = "the newest message alone" if dropped or len(starts) < 2 else "this conversation"
            raise ContextOverflow(
                f"The context is full: {what} needs {len(ids)} prompt tokens plus {reserve} for "
                f"the reply, but a sequence can hold {limit} tokens (max_model_len "
                f"{engine.max_model_len}). Start a new chat, shorten the message"
                + (
                    ", or let the app drop the oldest turns (Settings)."
                    if policy == "stop"
                    else "."
                )
            )
        turns = turns[starts[1] :]
        dropped += 1
        ids = prompt_ids(engine, system_prompt, turns)
    return ids, dropped
