"""truncate_prompt_tokens, as vLLM 0.33's OpenAI server applies it (-1 keeps max_model_len - 1
tokens; the side is truncation_side, else "left", keeping the prompt's end: vLLM's tokenizer
registry sets that side for every generating model, whatever the tokenizer's own says), with
one bound of our own: a text prompt is cut by characters before it is tokenized.

Invariant the cut rests on (the same one the character bound of every prompt uses): a token
spells at most `longest_token_chars` characters of the text, the longest vocabulary entry
(byte-level BPE spells a byte as one character, so no token covers more text than its own
spelling). So the last (keep + CUT_MARGIN_TOKENS) x longest_token_chars characters hold at least
that many tokens, and the last `keep` of them are the whole prompt's last `keep`: the margin
absorbs the tokens the cut itself splits differently. Only a single pre-token (a run with no
space or punctuation) longer than the margin and crossing the cut can split differently from
the whole prompt's. Without the cut, eight concurrent 3.9 MB prompts held the tokenizing pool
for tens of seconds while another client's 1-token completion waited behind them."""

from __future__ import annotations

from kvscope.app.serve.errors import APIError
from kvscope.app.serve.protocol import SamplingFields
from kvscope.app.serve.state import ServerState

CUT_MARGIN_TOKENS = 32  # tokens kept past `keep` on the cut side, then dropped after tokenizing


def truncation_keep(state: ServerState, body: SamplingFields) -> int | None:
    """How many tokens truncate_prompt_tokens keeps (None: no truncation), or its 400: checked
    before the prompt costs a tokenizer run."""
    keep = body.truncate_prompt_tokens
    if keep is None:
        return None
    limit = state.max_model_len
    if keep > limit:
        raise APIError(
            400,
            f"truncate_prompt_tokens={keep} cannot be greater than max_model_len = {limit}",
            "truncate_prompt_tokens",
        )
    return limit - 1 if keep < 0 else keep


def _keeps_the_end(body: SamplingFields) -> bool:
    return (body.truncation_side or "left") == "left"


def cut_text(state: ServerState, body: SamplingFields, text: str) -> str:
    """The part of a text prompt that surely holds the tokens truncation keeps (see module):
    the whole text without truncation or when it is short enough."""
    keep = truncation_keep(state, body)
    if keep is None:
        return text
    chars = (keep + CUT_MARGIN_TOKENS) * state.longest_token_chars
    if len(text) <= chars:
        return text
    return text[-chars:] if _keeps_the_end(body) else text[:chars]


def truncated_prompt(
    state: ServerState,
    body: SamplingFields,
    prompt: str | list[int],
    ids: list[int] | None,
) -> tuple[str | list[int], list[int] | None]:
    """The prompt after truncate_prompt_tokens. `prompt`: token ids, or text already through
    cut_text with `ids` its tokens (computed off the event loop by the caller). Returns the
    prompt to queue and its ids (None when it is ids itself)."""
    keep = truncation_keep(state, body)
    if keep is None:
        return prompt, ids
    tokens = prompt if ids is None else ids
    assert not isinstance(tokens, str)  # a text prompt always comes with its ids
    if keep >= len(tokens):
        return prompt, ids
    return list(tokens[-keep:] if _keeps_the_end(body) and keep else tokens[:keep]), None
