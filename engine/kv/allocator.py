"""KVAllocator: what the scheduler and the engine ask of a KV block allocator, and nothing more.

Two allocators implement it: `PagedAllocator` (paged, prefix cache, copy-on-write sharing) and
`ContiguousAllocator` (the naive max-length reservation baseline). Both decide only which
physical block holds which sequence's tokens; the tensors live in `kv_cache.KVCache`, and every
change is announced on the event log the allocator was built with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

# A table entry a sliding group has given back (it fell out of the window): never read.
NULL_BLOCK = -1


def live_from(table: list[int], end: int | None = None) -> int:
    """The first entry of a table that is not NULL (its released prefix ends there), looking no
    further than `end` (then `end` when all before it are NULL)."""
    end = len(table) if end is None else min(end, len(table))
    start = 0
    while start < end and table[start] == NULL_BLOCK:
        start += 1
    return start


class NoFreeBlocksError(RuntimeError):
    """Raised when an allocation is attempted without checking capacity first."""


@dataclass(frozen=True)
class PrefixMatch:
    """Cached blocks a new sequence can start with, and their prefix hashes.

    `block_ids` is group 0's table start; `groups`, when the allocator has several KV groups,
    every group's (a sliding group's may start with NULL_BLOCK entries: blocks its window no
    longer needs). All have the same length, the number of blocks matched."""

    block_ids: list[int]
    hashes: list[int]
    groups: tuple[list[int], ...] = ()

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)

    def group_ids(self, num_groups: int) -> tuple[list[int], ...]:
        """Every group's matched blocks (one list shared by all when built without groups)."""
        return self.groups or (self.block_ids,) * num_groups


def check_pool_size(num_blocks: int) -> None:
    if num_blocks < 1:
        raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")


class KVAllocator(Protocol):
    """Implementers subclass this explicitly and define every member themselves."""

    num_blocks: int
    block_size: int
    peak_used_blocks: int  # most blocks ever in use at once
    num_groups: int  # KV groups (engine.kv.layout); each sequence has one table per group

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
        """The sequence's (group 0) block table: physical block of each logical block (empty
        if none; NULL_BLOCK where a sliding group gave a block back)."""

    def tables_of(self, seq_id: int) -> tuple[tuple[int, ...], ...]:
        """Every group's block table of the sequence, by group."""

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

    def release_outside_window(self, seq_id: int, next_position: int) -> list[int]:
        """Give back the sliding groups' blocks wholly before the window of the token at
        `next_position`; returns the blocks that became free (none without sliding groups)."""

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every block of the parent (ValueError where nothing can be shared)."""

    def free(self, seq_id: int) -> list[int]:
        """Drop the sequence's table; returns the blocks that became free."""

    def cache_full_blocks(self, seq_id: int, token_ids: Sequence[int], num_computed: int) -> None:
        """Make the sequence's newly filled full blocks reusable as a cached prefix."""

    def check_invariants(self) -> None:
        """Raise AssertionError unless the bookkeeping is exact (tests call it after scenarios)."""
