"""A request's prompt before it is queued: text or token ids checked and tokenized, chat
messages through the model's template within its budget.

Kept apart from the engine's stepping: these are the parts a server runs off the engine
thread (tokenizing a long prompt there would stall every running stream), and the parts
that read untrusted data (the template comes with the model file).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvscope.engine.model.templates.fallbacks import missing_template_error
from kvscope.engine.model.templates.render import Budget, render_chat_template

if TYPE_CHECKING:  # importing transformers costs seconds; only the type is needed here
    from transformers import PreTrainedTokenizerBase

PromptInput = str | list[int]
TEMPLATE_SECONDS = 2.0  # a chat template renders in ms; a looping one is stopped here
MIN_TEMPLATE_CHARS = 1_000_000  # the least size budget a template gets


def longest_token_chars(tokenizer: PreTrainedTokenizerBase) -> int:
    """Characters of the longest vocabulary entry, as the tokenizer spells it (byte-level BPE
    spells a byte as one character, so a token never decodes to more characters than this)."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1) or 1


def check_token_ids(prompt: Sequence[int], vocab: int) -> list[int]:
    """Token ids as a list, each an int (not a bool) inside the vocabulary."""
    if isinstance(prompt, (bytes, bytearray, memoryview)):
        raise ValueError("prompt is bytes: pass text (str) or a list of token ids")
    ids = list(prompt)
    # bool is an int subclass: True would silently become token 1.
    bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
    if bad:
        raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
    return ids


def tokenize(
    tokenizer: PreTrainedTokenizerBase, vocab: int, prompt: PromptInput
) -> tuple[str | None, list[int]]:
    """(text or None, token ids) of a text prompt or a list of token ids."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt is empty")
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate (e.g. from undecodable argv)
            raise ValueError(f"prompt is not valid text: {e}") from e
        return prompt, tokenizer.encode(prompt, add_special_tokens=False)
    return None, check_token_ids(prompt, vocab)


def template_budget(
    messages: list[dict[str, Any]], max_prompt_chars: int, extra_chars: int = 0
) -> Budget:
    """A chat template's budget: 2 s, and values of a few times what could still fit the
    context (or the messages themselves, when truncation will cut them). `extra_chars`: what
    else the template is given (the tools' JSON)."""
    given = extra_chars + sum(len(m["content"]) for m in messages if isinstance(m["content"], str))
    chars = max(MIN_TEMPLATE_CHARS, 2 * max_prompt_chars, 2 * given)
    return Budget(seconds=TEMPLATE_SECONDS, chars=chars)


def chat_prompt(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    budget_chars: int,
    architecture: str,
    source: str,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The prompt the model's chat template makes of `messages` (see
    LLMEngine.apply_chat_template)."""
    if not messages:
        raise ValueError("chat messages are empty")
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"chat message {m!r} needs 'role' and 'content'")
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise missing_template_error(architecture, source)
    tools_chars = len(json.dumps(tools)) if tools else 0
    budget = template_budget(messages, budget_chars, tools_chars)
    return render_chat_template(
        template,
        messages,
        tokenizer.special_tokens_map,
        budget,
        tools=tools,
        template_kwargs=template_kwargs,
    )
