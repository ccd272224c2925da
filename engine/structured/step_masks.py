"""The allowed-token masks of one engine step, computed on a worker thread while the model runs:
a sequence's next mask depends only on the tokens it has already taken, all known before the
forward pass starts. The worker also turns each bitmask into the row the sampler adds to the
logits (0 or -inf per token), so that a constrained neighbour costs the step's critical path one
vector add per constrained row."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from kvscope.engine.structured.compiler import GrammarMatcher


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


# A byte of mask bits -> the 8 floats the sampler adds for its tokens: 0.0 where the bit is set,
# else 0xFF800000, -inf ((bit - 1) * 2**23 as int32).
_BITS_OF_BYTE = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")
_BYTE_TO_FLOATS = ((_BITS_OF_BYTE.astype(np.int32) - 1) * 0x800000).view(np.float32)


@dataclass(frozen=True)
class TokenMask:
    """One constrained sequence's next token, as the sampler adds it to its logits row."""

    bitmask: torch.Tensor  # int32 words as the grammar wrote them: bit i of word w = token 32w+i
    additive: torch.Tensor  # float32 [logits columns]: 0 where allowed, -inf where not
    allows_any: bool  # some column of the logits is allowed


def token_masks(bitmask: torch.Tensor, columns: int) -> list[TokenMask]:
    """[rows, words] int32 bitmasks -> a TokenMask per row, over the first `columns` tokens
    (a model's logits may be narrower than its tokenizer; columns past it are never allowed)."""
    rows, words = bitmask.shape
    # Each byte of the words names 8 tokens: one lookup writes their 8 floats (bytes of a
    # little-endian word, lowest first, are tokens 32w, 32w+8, ...).
    as_bytes = np.asarray(bitmask.numpy(), dtype="<i4").view(np.uint8)
    additive = np.take(_BYTE_TO_FLOATS, as_bytes, axis=0).reshape(rows, words * 32)
    if columns > words * 32:
        beyond = np.full((rows, columns - words * 32), -np.inf, dtype=np.float32)
        additive = np.concatenate([additive, beyond], axis=1)
    table = torch.from_numpy(additive[:, :columns])
    allows_any = _any_bit_below(bitmask, columns).tolist()
    return [TokenMask(bitmask[i], table[i], allows_any[i]) for i in range(rows)]


def _any_bit_below(bitmask: torch.Tensor, columns: int) -> torch.Tensor:
    """Per row, whether a token below `columns` is allowed: read from the words, 32 tokens a
    compare (a bool row's any() over a 49k vocabulary costs as much as the rest of the mask)."""
    full = min(columns // 32, bitmask.shape[1])
    found = bitmask[:, :full].ne(0).any(-1)
    rest = columns % 32
    if rest and full < bitmask.shape[1]:
        found |= (bitmask[:, full] & ((1 << rest) - 1)).ne(0)
    return found


class StepMasks:
    """Masks for a step's constrained sequences, keyed by seq_id."""

    def __init__(self, vocab_size: Callable[[], int], columns: int) -> None:
        # Read when a mask is filled: the grammar's vocabulary is wrapped on first use.
        self._vocab_size = vocab_size
        self._columns = columns  # the model's logits
        self._pool: ThreadPoolExecutor | None = None

    def start(self, matchers: Sequence[tuple[int, GrammarMatcher]]) -> Future[dict[int, TokenMask]]:
        """Begin filling one mask per (seq_id, matcher); the future's result maps seq_id to
        its TokenMask."""
        if self._pool is None:
            # One thread: mask work is small and the forward pass owns the cores.
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvscope-grammar")
        return self._pool.submit(self.fill, list(matchers))

    def fill(self, matchers: Sequence[tuple[int, GrammarMatcher]]) -> dict[int, TokenMask]:
        words = bitmask_words(self._vocab_size())
        bitmask = torch.empty((len(matchers), words), dtype=torch.int32)
        for row, (_, matcher) in enumerate(matchers):
            matcher.fill_mask(bitmask[row])
        masks = token_masks(bitmask, self._columns)
        return {seq_id: mask for (seq_id, _), mask in zip(matchers, masks, strict=True)}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
