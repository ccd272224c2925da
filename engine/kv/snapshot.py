"""KVSnapshot: an immutable copy of the KV pool's state, cheap to take and safe to hand to a GUI.

One entry per physical block (numpy arrays), one `SequenceInfo` per live sequence, and the pool's
metrics. The app draws these; it never reads the engine's live structures.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["BlockState", "free_runs", "KVSnapshot", "PoolMetrics", "SequenceInfo"]


class BlockState(enum.IntEnum):
    FREE = 0  # holds nothing reusable
    USED = 1  # referenced by at least one sequence's block table
    CACHED = 2  # free, but still holds a hashed prefix that a later request can adopt
    RESERVED = 3  # held by a contiguous reservation, no tokens written yet


@dataclass(frozen=True)
class SequenceInfo:
    seq_id: int
    request_id: str
    index: int  # sample index within its request (n > 1)
    status: str  # "waiting" | "running" | "preempted" | "finished"
    num_prompt_tokens: int
    num_tokens: int  # prompt + generated so far
    num_computed_tokens: int  # tokens whose K/V are in the pool
    num_cached_tokens: int  # prompt tokens served from the prefix cache at admission
    # The blocks the sequence holds: for a single full-attention group, its table (the physical
    # block of each logical block); with KV groups, every group's live blocks in group order.
    block_table: tuple[int, ...]
    reserved_blocks: tuple[int, ...] = ()  # contiguous allocator: the whole reservation
    # With several KV groups or a sliding window: each group's table, -1 where a block fell
    # out of the window and went back to the pool. Empty otherwise (block_table says it all).
    group_tables: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class PoolMetrics:
    blocks_total: int
    blocks_used: int
    blocks_free: int
    blocks_cached: int
    blocks_reserved: int
    blocks_shared: int  # ref count > 1
    tokens_stored: int  # physical slots holding K/V (a shared block counts once)
    slots_held: int  # slots of used + reserved blocks
    useful_slot_share: float  # tokens_stored / slots_held (1.0 when nothing is held)
    internal_waste_slots: int  # slots_held - tokens_stored
    prefix_query_tokens: int
    prefix_hit_tokens: int
    prefix_hit_rate: float
    num_running: int
    num_waiting: int
    num_preempted: int  # waiting again after preemption
    num_preemptions: int  # cumulative
    largest_free_run: int  # longest run of physically adjacent free blocks
    num_free_runs: int  # holes: separate runs of free blocks
    # Contiguous shadow only: sequences the paged engine runs that this allocator cannot place.
    num_would_wait: int = 0
    # KV groups (engine.kv.layout): blocks each group's tables hold now, and the blocks sliding
    # windows have given back while their sequences ran, ever.
    group_blocks_used: tuple[int, ...] = ()
    blocks_released: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, eq=False)
class KVSnapshot:
    step: int
    timestamp: float
    allocator: str  # "paged" | "contiguous" | "contiguous-shadow"
    block_size: int
    num_blocks: int
    # Per physical block, length num_blocks:
    state: np.ndarray  # uint8 BlockState
    owner: np.ndarray  # int64 seq id of the first owner, -1 if none
    num_owners: np.ndarray  # int32 sequences whose tables hold the block
    ref_count: np.ndarray  # int32
    filled: np.ndarray  # int32 slots holding K/V (0..block_size)
    logical_index: np.ndarray  # int32 index in the owner's table (-1 if none)
    has_hash: np.ndarray  # bool: holds a full, hashed prefix block
    sequences: tuple[SequenceInfo, ...]
    metrics: PoolMetrics
    # int16 KV group of each used or cached block (-1 if none), and each group's window in
    # tokens (None = full attention). One group (0) for a model whose layers attend alike.
    group: np.ndarray | None = None
    group_windows: tuple[int | None, ...] = (None,)

    def sequence(self, seq_id: int) -> SequenceInfo | None:
        return next((s for s in self.sequences if s.seq_id == seq_id), None)

    def equals(self, other: KVSnapshot) -> bool:
        """Same pool state (timestamps aside): what a replay must reproduce."""
        arrays = (
            "state",
            "owner",
            "num_owners",
            "ref_count",
            "filled",
            "logical_index",
            "has_hash",
        )
        same_groups = self.group_windows == other.group_windows and (
            (self.group is None and other.group is None)
            or (
                self.group is not None
                and other.group is not None
                and np.array_equal(self.group, other.group)
            )
        )
        return (
            same_groups
            and self.step == other.step
            and self.allocator == other.allocator
            and self.block_size == other.block_size
            and self.num_blocks == other.num_blocks
            and all(np.array_equal(getattr(self, a), getattr(other, a)) for a in arrays)
            and self.sequences == other.sequences
            and self.metrics == other.metrics
        )


def free_runs(state: np.ndarray) -> tuple[int, int]:
    """(largest run, number of runs) of physically adjacent FREE/CACHED blocks."""
    free = (state == BlockState.FREE) | (state == BlockState.CACHED)
    if not free.any():
        return 0, 0
    padded = np.concatenate(([False], free, [False])).astype(np.int8)
    edges = np.diff(padded)
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    lengths = ends - starts
    return int(lengths.max()), int(lengths.size)
