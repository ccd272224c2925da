"""How many full-length sequences a KV pool holds, and the warning when the comparison is void.

The naive (contiguous) allocator reserves ceil(max_seq_len / block_size) blocks per sequence the
moment it is admitted, so a pool that holds fewer than two reservations runs one sequence at a
time: every paged-vs-naive figure then compares a pool against a single reservation. The
settings dialog, the status bar and the block map all say so with the same words, from here.

A model with several KV groups (Gemma 3's sliding and full layers, engine/kv/layout.py) keeps a
block per group for every block_size tokens; the naive scheme reserves every group for the
whole length, so a reservation is num_groups times as many blocks (as engine/kv/shadow.py
places it).
"""

from __future__ import annotations

import math

# Fewer naive sequences than this and the comparison says little: one runs, the rest wait.
MIN_NAIVE_SEQUENCES = 2
# What the hint suggests: a context the pool holds this many times over.
SUGGESTED_CONTEXTS = 4


def max_seq_len(num_blocks: int, block_size: int, max_model_len: int) -> int:
    """The longest sequence the engine admits: max_model_len, or the whole pool if smaller."""
    return min(max_model_len, num_blocks * block_size)


def reservation_blocks(
    num_blocks: int, block_size: int, max_model_len: int, num_groups: int = 1
) -> int:
    """Blocks one naive reservation takes: the whole length in every KV group (at most the
    pool, as the shadow caps it)."""
    length = max_seq_len(num_blocks, block_size, max_model_len) * num_groups
    return max(1, math.ceil(min(length, num_blocks * block_size) / block_size))


def naive_sequences(
    num_blocks: int, block_size: int, max_model_len: int, num_groups: int = 1
) -> int:
    """Full-length reservations the naive allocator fits in the pool at once."""
    return num_blocks // reservation_blocks(num_blocks, block_size, max_model_len, num_groups)


def full_contexts(num_blocks: int, block_size: int, max_model_len: int) -> float:
    """Pool tokens over max_model_len: how many full contexts the paged pool holds."""
    return num_blocks * block_size / max(1, max_model_len)


def naive_warning(num_blocks: int, block_size: int, max_model_len: int, num_groups: int = 1) -> str:
    """A sentence when the naive allocator cannot hold MIN_NAIVE_SEQUENCES sequences, else ''."""
    fits = naive_sequences(num_blocks, block_size, max_model_len, num_groups)
    if fits >= MIN_NAIVE_SEQUENCES:
        return ""
    reservation = reservation_blocks(num_blocks, block_size, max_model_len, num_groups)
    groups = max(1, num_groups)
    suggested = max(block_size, num_blocks // SUGGESTED_CONTEXTS // groups * block_size)
    return (
        f"The naive allocator reserves {reservation:,} of {num_blocks:,} blocks per sequence"
        f" (max model length {max_model_len:,}), so it runs {fits} sequence at a time and the"
        f" comparison says little. Set max model length to {suggested:,} or less, or raise the"
        " KV budget."
    )


def prediction_line(
    num_blocks: int, block_size: int, max_model_len: int, num_groups: int = 1
) -> str:
    """The settings dialog's line about the naive side: how many sequences it fits, or the
    warning in bold when it fits fewer than two."""
    warning = naive_warning(num_blocks, block_size, max_model_len, num_groups)
    if warning:
        return f"<b style='color:#F2B84B'>⚠ {warning}</b>"
    fits = naive_sequences(num_blocks, block_size, max_model_len, num_groups)
    each = reservation_blocks(num_blocks, block_size, max_model_len, num_groups)
    groups = f" in each of {num_groups} KV groups" if num_groups > 1 else ""
    return (
        f"Naive allocator: {fits:,} full-length sequences side by side ({each:,} blocks each:"
        f" the whole length{groups})"
    )
