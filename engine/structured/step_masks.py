"""The allowed-token bitmasks of one engine step, computed on a worker thread while the model
runs: a sequence's next mask depends only on the tokens it has already taken, all known before
the forward pass starts, so masking adds no time to a step unless the masks take longer than
the forward itself."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from kvscope.engine.structured.compiler import GrammarMatcher


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


class StepMasks:
    """Masks for a step's constrained sequences, keyed by seq_id."""

    def __init__(self, vocab_size: Callable[[], int]) -> None:
        # Read when a mask is filled: the grammar's vocabulary is wrapped on first use.
        self._vocab_size = vocab_size
        self._pool: ThreadPoolExecutor | None = None

    def start(
        self, matchers: Sequence[tuple[int, GrammarMatcher]]
    ) -> Future[dict[int, torch.Tensor]]:
        """Begin filling one mask per (seq_id, matcher); the future's result maps seq_id to
        its int32 bitmask row."""
        if self._pool is None:
            # One thread: mask work is small and the forward pass owns the cores.
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvscope-grammar")
        return self._pool.submit(self.fill, list(matchers))

    def fill(self, matchers: Sequence[tuple[int, GrammarMatcher]]) -> dict[int, torch.Tensor]:
        words = bitmask_words(self._vocab_size())
        bitmask = torch.empty((len(matchers), words), dtype=torch.int32)
        rows: dict[int, torch.Tensor] = {}
        for row, (seq_id, matcher) in enumerate(matchers):
            matcher.fill_mask(bitmask[row])
            rows[seq_id] = bitmask[row]
        return rows

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[rows, words] int32 -> [rows, vocab_size] bool: True where the token is allowed."""
    if sys.byteorder == "little" and bitmask.device.type == "cpu":
        # Bit i of a little-endian word is bit i % 8 of its byte i // 8: numpy's table-driven
        # unpack, 4x the shifts below on a 49k vocabulary.
        bytes_ = bitmask.contiguous().numpy().view(np.uint8)
        allowed = torch.from_numpy(np.unpackbits(bytes_, axis=1, bitorder="little")).bool()
    else:
        shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
        allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).flatten(1).bool()
    if allowed.shape[1] < vocab_size:  # logits wider than the tokenizer: the rest is never valid
        allowed = torch.nn.functional.pad(allowed, (0, vocab_size - allowed.shape[1]))
    return allowed[:, :vocab_size]
