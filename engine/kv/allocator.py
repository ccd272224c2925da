"""KVAllocator: what the scheduler and the engine ask of a KV block allocator, and nothing more.

Two allocators implement it: `BlockManager` (paged, prefix cache, copy-on-write sharing) and
`ContiguousBlockManager` (the naive max-length reservation baseline). Both decide only which
physical block holds which sequence's tokens; the tensors live in `kv_cache.KVCache`, and every
change is announced on the event log the allocator was built with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class NoFreeBlocksError(RuntimeError):
    """Raised when an allocation is attempted without checking capacity first."""


@dataclass(frozen=True)
class PrefixMatch:
    """Cached blocks a new sequence can start with, and their prefix hashes."""

    block_ids: list[int]
    hashes: list[int]


def check_pool_size(num_blocks: int) -> None:
    if num_blocks < 1:
        raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")


class KVAllocator(Protocol):
    """Implementers subclass this explicitly and define every member themselves."""

    num_blocks: int
    block_size: int
    peak_used_blocks: int  # most blocks ever in use at once

    # ---- occupancy (what stats() reports) --------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks a new allocation could take (cached ones included)."""

    @property
    def num_used_blocks(self) -> int: ...

    @property
    def num_cached_blocks(self) -> int:
        """Free blocks that still hold a reusable prefix."""

    @property
    def num_evictions(self) -> int:
        """Cached prefixes dropped to make room, ever."""

    @property
    def num_cow_copies(self) -> int:
        """Shared blocks copied before a write, ever."""

    def blocks_for_tokens(self, num_tokens: int) -> int: ...

    def table(self, seq_id: int) -> list[int]:
        """The sequence's block table: physical block of each logical block (empty if none)."""

    def cached_block_tokens(self, block_id: int) -> tuple[int, ...] | None:
        """The tokens a hashed (prefix-cache) block holds, None for any other block."""

    # ---- admission -----------------------------------------------------------------------
    def match_prefix(self, token_ids: Sequence[int]) -> PrefixMatch:
        """The longest run of cached blocks that starts `token_ids`."""

    def can_adopt(self, match: PrefixMatch, total_tokens: int) -> bool:
        """Room for a new sequence that starts with `match` and needs `total_tokens` slots."""

    def adopt(self, seq_id: int, match: PrefixMatch) -> None:
        """Start `seq_id`'s table with the matched blocks."""

    # ---- growth and release --------------------------------------------------------------
    def can_grow(self, seq_id: int, total_tokens: int, write_from: int | None = None) -> bool: ...

    def grow(
        self, seq_id: int, total_tokens: int, write_from: int | None = None
    ) -> list[tuple[int, int]]:
        """Room for `total_tokens`; returns the (src, dst) block copies the pool must perform
        first (copy-on-write of a shared block at `write_from`)."""

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every block of the parent (ValueError where nothing can be shared)."""

    def free(self, seq_id: int) -> list[int]:
        """Drop the sequence's table; returns the blocks that became free."""

    def cache_full_blocks(self, seq_id: int, token_ids: Sequence[int], num_computed: int) -> None:
        """Make the sequence's newly filled full blocks reusable as a cached prefix."""

    def check_invariants(self) -> None:
        """Raise AssertionError unless the bookkeeping is exact (tests call it after scenarios)."""
