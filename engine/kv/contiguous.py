"""The naive baseline: every sequence reserves max-length contiguous space when it is admitted.

This is what static, Orca/FasterTransformer-style KV allocation does: at admission a sequence
takes ceil(max_seq_len / block_size) physically adjacent blocks (first fit) whether it will use
them or not. `ContiguousAllocator` is a drop-in for the paged block manager, so the engine runs
real requests this way on the same pool and kernels; a request waits when no run is long enough,
even if enough blocks are free in total. No prefix caching, no sharing, never a preemption.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvscope.engine.kv.allocator import KVAllocator, NoFreeBlocksError, PrefixMatch, check_pool_size
from kvscope.engine.kv.events import BlocksAllocated, BlocksFreed, BlocksReserved, EventLog


def first_fit(reserved: np.ndarray, length: int) -> int | None:
    """Start of the first run of `length` unreserved blocks, or None."""
    free = np.concatenate(([False], ~reserved, [False])).astype(np.int8)
    edges = np.diff(free)
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    fits = np.flatnonzero(ends - starts >= length)
    return int(starts[fits[0]]) if fits.size else None


class ContiguousAllocator(KVAllocator):
    """The KVAllocator of PagedAllocator, contiguous max-length reservations underneath."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_seq_len: int,
        events: EventLog | None = None,
    ) -> None:
        check_pool_size(num_blocks)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.reservation_blocks = self.blocks_for_tokens(max_seq_len)
        if self.reservation_blocks > num_blocks:
            raise ValueError(
                f"a {max_seq_len}-token reservation needs {self.reservation_blocks} blocks, "
                f"the pool has {num_blocks}"
            )
        self.reserved = np.zeros(num_blocks, dtype=bool)
        self.reservations: dict[int, int] = {}  # seq_id -> first block of its run
        self.tables: dict[int, list[int]] = {}
        self.peak_used_blocks = 0
        self.events = events if events is not None else EventLog()

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.num_used_blocks

    @property
    def num_used_blocks(self) -> int:
        """Reserved blocks count as used: nobody else can have them."""
        return len(self.reservations) * self.reservation_blocks

    # No prefix cache and no sharing: nothing is ever cached, evicted or copied.
    @property
    def num_cached_blocks(self) -> int:
        return 0

    @property
    def num_evictions(self) -> int:
        return 0

    @property
    def num_cow_copies(self) -> int:
        return 0

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    num_groups = 1  # the naive baseline lays every model out as one group, never releasing

    def table(self, seq_id: int) -> list[int]:
        return self.tables.get(seq_id, [])

    def tables_of(self, seq_id: int) -> tuple[tuple[int, ...], ...]:
        return (tuple(self.table(seq_id)),)

    def release_outside_window(self, seq_id: int, next_position: int) -> list[int]:
        """Nothing: a reservation is held whole until the sequence ends."""
        return []

    def cached_block_tokens(self, block_id: int) -> tuple[int, ...] | None:
        return None

    # ---- admission -----------------------------------------------------------------------
    def match_prefix(self, token_ids: Sequence[int]) -> PrefixMatch:
        return PrefixMatch([], [])

    def can_adopt(self, match: PrefixMatch, total_tokens: int) -> bool:
        return first_fit(self.reserved, self.reservation_blocks) is not None

    def adopt(self, seq_id: int, match: PrefixMatch) -> None:
        assert seq_id not in self.reservations, f"sequence {seq_id} already has a reservation"
        start = first_fit(self.reserved, self.reservation_blocks)
        if start is None:
            raise NoFreeBlocksError(
                f"no run of {self.reservation_blocks} contiguous free blocks for sequence {seq_id}"
            )
        self.reserved[start : start + self.reservation_blocks] = True
        self.reservations[seq_id] = start
        self.tables[seq_id] = []
        self.peak_used_blocks = max(self.peak_used_blocks, self.num_used_blocks)
        blocks = tuple(range(start, start + self.reservation_blocks))
        self.events.emit(BlocksReserved, seq_id=seq_id, blocks=blocks)

    def cache_full_blocks(self, seq_id: int, token_ids: Sequence[int], num_computed: int) -> None:
        """No prefix cache in the naive allocator."""

    # ---- growth --------------------------------------------------------------------------
    def can_grow(self, seq_id: int, total_tokens: int, write_from: int | None = None) -> bool:
        return self.blocks_for_tokens(total_tokens) <= self.reservation_blocks

    def grow(
        self, seq_id: int, total_tokens: int, write_from: int | None = None
    ) -> list[tuple[int, int]]:
        """Hand out the next blocks of the sequence's own reservation; never copies."""
        needed = self.blocks_for_tokens(total_tokens)
        if needed > self.reservation_blocks:
            raise NoFreeBlocksError(
                f"sequence {seq_id} needs {needed} blocks, its reservation has "
                f"{self.reservation_blocks}"
            )
        table = self.tables[seq_id]
        start = self.reservations[seq_id]
        old = len(table)
        table.extend(range(start + old, start + needed))
        if needed > old:
            self.events.emit(BlocksAllocated, seq_id=seq_id, blocks=tuple(table[old:]), start=old)
        return []

    def fork(self, parent_id: int, child_id: int) -> None:
        raise ValueError("the contiguous allocator cannot share blocks between sequences")

    def free(self, seq_id: int) -> list[int]:
        start = self.reservations.pop(seq_id, None)
        table = self.tables.pop(seq_id, [])
        if start is None:
            return []
        self.events.emit(BlocksFreed, seq_id=seq_id, blocks=tuple(table))
        self.reserved[start : start + self.reservation_blocks] = False
        return list(range(start, start + self.reservation_blocks))

    # ---- invariants ----------------------------------------------------------------------
    def check_invariants(self) -> None:
        expected = np.zeros(self.num_blocks, dtype=bool)
        for seq_id, start in self.reservations.items():
            run = expected[start : start + self.reservation_blocks]
            assert not run.any(), f"sequence {seq_id}'s reservation overlaps another"
            assert len(run) == self.reservation_blocks, f"sequence {seq_id} runs past the pool"
            run[:] = True
            table = self.tables[seq_id]
            assert table == list(range(start, start + len(table))), (
                f"sequence {seq_id}'s table {table[:4]}... is not a prefix of its reservation"
            )
        assert np.array_equal(expected, self.reserved), "reserved map disagrees with reservations"
        assert set(self.tables) == set(self.reservations), "tables and reservations disagree"
