"""PoolTelemetry: follows the KV event stream and keeps the pool's state as numpy arrays.

It is an observer, not a second allocator: it learns everything from events (so a recorded
session replays into exactly the same snapshots), and tests check it against the block manager
after every step. `snapshot()` copies its arrays, which keeps it cheap at 100,000 blocks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from kvscope.engine.kv.events import (
    BlockCopiedOnWrite,
    BlockEvicted,
    BlocksAllocated,
    BlocksFreed,
    BlocksHashed,
    BlocksReleased,
    BlocksReserved,
    KVEvent,
    PrefixCacheHit,
    SequenceAdded,
    SequenceAdmitted,
    SequenceFinished,
    SequenceForked,
    SequencePreempted,
    StepProgress,
)
from kvscope.engine.kv.snapshot import BlockState, KVSnapshot, PoolMetrics, SequenceInfo, free_runs

NULL = -1  # a table entry a sliding group gave back (engine.kv.allocator.NULL_BLOCK)


@dataclass
class SequenceTrack:
    request_id: str
    index: int
    num_prompt_tokens: int
    num_tokens: int
    status: str = "waiting"
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    # One table per KV group, NULL where a sliding group released the block.
    tables: dict[int, list[int]] = field(default_factory=dict)
    reserved: tuple[int, ...] = ()
    finished_step: int | None = None

    @property
    def table(self) -> list[int]:
        """Group 0's table (a single-group model's only one)."""
        return self.tables.get(0, [])

    def group_table(self, group: int) -> list[int]:
        return self.tables.setdefault(group, [])

    def held(self) -> tuple[int, ...]:
        """Every block the sequence holds, group by group, in table order."""
        return tuple(b for g in sorted(self.tables) for b in self.tables[g] if b != NULL)

    def info(self, seq_id: int) -> SequenceInfo:
        return SequenceInfo(
            seq_id=seq_id,
            request_id=self.request_id,
            index=self.index,
            status=self.status,
            num_prompt_tokens=self.num_prompt_tokens,
            num_tokens=self.num_tokens,
            num_computed_tokens=self.num_computed_tokens,
            num_cached_tokens=self.num_cached_tokens,
            block_table=self.held(),
            reserved_blocks=self.reserved,
            group_tables=tuple(tuple(self.tables[g]) for g in sorted(self.tables))
            if len(self.tables) > 1 or NULL in self.table
            else (),
        )


@dataclass
class PoolCounters:
    """Cumulative counts of the pool's traffic. The telemetry owns them (it sees every event);
    `stats()` and the snapshot's metrics both read them from here."""

    num_preemptions: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    blocks_released: int = 0  # given back by sliding windows while their sequences ran

    def __call__(self, event: KVEvent) -> None:
        """Count one event (a listener of its own where no snapshot is wanted: a what-if sweep)."""
        if isinstance(event, SequenceAdmitted):
            self.prefix_query_tokens += event.query_tokens
            self.prefix_hit_tokens += event.hit_tokens
        elif isinstance(event, SequencePreempted):
            self.num_preemptions += 1
        elif isinstance(event, BlocksReleased):
            self.blocks_released += len(event.blocks)


class PoolTelemetry:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        allocator: str = "paged",
        group_windows: tuple[int | None, ...] = (None,),
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.allocator = allocator
        self.group_windows = group_windows  # each KV group's window (None = full attention)
        # KV group of a used or cached block, -1 for none. int16: a recording may declare up to
        # 256 groups (engine.kv.replay), a what-if trace up to its layers (engine.trace.records).
        self.group = np.full(num_blocks, -1, dtype=np.int16)
        self.state = np.zeros(num_blocks, dtype=np.uint8)
        self.ref_count = np.zeros(num_blocks, dtype=np.int32)
        self.owner = np.full(num_blocks, -1, dtype=np.int64)
        self.logical_index = np.full(num_blocks, -1, dtype=np.int32)
        self.has_hash = np.zeros(num_blocks, dtype=bool)
        self.seqs: dict[int, SequenceTrack] = {}
        self.step = 0
        self.counters = PoolCounters()

    # ---- event handling ------------------------------------------------------------------
    def __call__(self, event: KVEvent) -> None:
        self.step = event.step
        self.counters(event)
        self._HANDLERS[type(event)](self, event)

    def _on_added(self, e: SequenceAdded) -> None:
        self.seqs[e.seq_id] = SequenceTrack(
            e.request_id, e.sample, e.num_prompt_tokens, e.num_prompt_tokens
        )

    def _on_admitted(self, e: SequenceAdmitted) -> None:
        track = self.seqs[e.seq_id]
        track.status = "running"
        if e.first:
            track.num_cached_tokens = e.hit_tokens
        track.num_computed_tokens = e.hit_tokens

    def _on_reserved(self, e: BlocksReserved) -> None:
        blocks = np.asarray(e.blocks, dtype=np.int64)
        self.state[blocks] = BlockState.RESERVED
        self.owner[blocks] = e.seq_id
        self.logical_index[blocks] = np.arange(len(blocks))
        self.seqs[e.seq_id].reserved = e.blocks

    def _on_allocated(self, e: BlocksAllocated) -> None:
        blocks = np.asarray(e.blocks, dtype=np.int64)
        self.state[blocks] = BlockState.USED
        self.ref_count[blocks] = 1
        self.owner[blocks] = e.seq_id
        self.logical_index[blocks] = np.arange(e.start, e.start + len(blocks))
        self.group[blocks] = e.group
        table = self.seqs[e.seq_id].group_table(e.group)
        del table[e.start :]
        table.extend(e.blocks)

    def _on_cache_hit(self, e: PrefixCacheHit) -> None:
        for i, b in enumerate(e.blocks, start=e.start):
            if self.ref_count[b] == 0:
                self.state[b] = BlockState.USED
                self.owner[b] = e.seq_id
                self.logical_index[b] = i
                self.group[b] = e.group
            self.ref_count[b] += 1
        self.seqs[e.seq_id].tables[e.group] = [NULL] * e.start + list(e.blocks)

    def _on_hashed(self, e: BlocksHashed) -> None:
        self.has_hash[list(e.blocks)] = True

    def _on_evicted(self, e: BlockEvicted) -> None:
        self.has_hash[e.block] = False
        self.state[e.block] = BlockState.FREE
        self.group[e.block] = -1

    def _on_copied(self, e: BlockCopiedOnWrite) -> None:
        src, dst = e.src, e.dst
        self.seqs[e.seq_id].group_table(e.group)[e.index] = dst
        self.ref_count[src] -= 1
        if self.owner[src] == e.seq_id:
            self._reassign_owner(src, e.index, e.seq_id)
        self.state[dst] = BlockState.USED
        self.ref_count[dst] = 1
        self.owner[dst] = e.seq_id
        self.logical_index[dst] = e.index
        self.group[dst] = e.group

    def _on_forked(self, e: SequenceForked) -> None:
        self.ref_count[list(e.blocks)] += 1
        child = self.seqs[e.seq_id]
        parent = self.seqs[e.parent]
        child.tables[e.group] = [NULL] * e.start + list(e.blocks)
        child.status = "running"
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens

    def _drop(self, seq_id: int, blocks: tuple[int, ...], start: int) -> None:
        """One reference fewer on each of `blocks` (table[start:...] of seq_id)."""
        for i, b in enumerate(blocks, start=start):
            self.ref_count[b] -= 1
            if self.ref_count[b] == 0:
                self.state[b] = BlockState.CACHED if self.has_hash[b] else BlockState.FREE
                self.owner[b] = -1
                self.logical_index[b] = -1
                if not self.has_hash[b]:
                    self.group[b] = -1
            elif self.owner[b] == seq_id:
                self._reassign_owner(b, i, seq_id)

    def _on_released(self, e: BlocksReleased) -> None:
        table = self.seqs[e.seq_id].group_table(e.group)
        table[e.start : e.start + len(e.blocks)] = [NULL] * len(e.blocks)
        self._drop(e.seq_id, e.blocks, e.start)

    def _on_freed(self, e: BlocksFreed) -> None:
        track = self.seqs[e.seq_id]
        # The table leaves first, so a shared block's next owner is found among the others.
        track.tables.pop(e.group, None)
        self._drop(e.seq_id, e.blocks, e.start)
        if track.reserved:
            rest = np.asarray(track.reserved[len(e.blocks) :], dtype=np.int64)
            self.state[rest] = BlockState.FREE
            self.owner[rest] = -1
            self.logical_index[rest] = -1
            track.reserved = ()

    def _on_preempted(self, e: SequencePreempted) -> None:
        track = self.seqs[e.seq_id]
        track.status = "preempted"
        track.num_computed_tokens = 0

    def _on_finished(self, e: SequenceFinished) -> None:
        track = self.seqs.get(e.seq_id)
        if track is not None:
            track.status = "finished"
            track.finished_step = e.step

    def _on_progress(self, e: StepProgress) -> None:
        # Sequences finished in an earlier step leave the snapshot; this step's stay visible.
        for seq_id in [s for s, t in self.seqs.items() if t.finished_step not in (None, e.step)]:
            del self.seqs[seq_id]
        for seq_id, num_tokens, num_computed in e.lens:
            track = self.seqs.get(seq_id)
            if track is not None:
                track.num_tokens = num_tokens
                track.num_computed_tokens = num_computed

    # One handler per event class; a class without one is a KeyError in every test.
    _HANDLERS: ClassVar[dict[type[KVEvent], Callable[[PoolTelemetry, Any], None]]] = {
        SequenceAdded: _on_added,
        SequenceAdmitted: _on_admitted,
        BlocksReserved: _on_reserved,
        BlocksAllocated: _on_allocated,
        PrefixCacheHit: _on_cache_hit,
        BlocksHashed: _on_hashed,
        BlockEvicted: _on_evicted,
        BlockCopiedOnWrite: _on_copied,
        SequenceForked: _on_forked,
        BlocksFreed: _on_freed,
        BlocksReleased: _on_released,
        SequencePreempted: _on_preempted,
        SequenceFinished: _on_finished,
        StepProgress: _on_progress,
    }

    def _reassign_owner(self, block: int, index: int, leaving: int) -> None:
        # A shared block sits at the same logical index of the same group's table in every
        # sequence holding it (prefix matches and forks both keep positions), so one probe per
        # sequence finds the next owner.
        group = int(self.group[block])
        for seq_id, track in self.seqs.items():
            table = track.tables.get(group, [])
            if seq_id != leaving and index < len(table) and table[index] == block:
                self.owner[block] = seq_id
                return
        raise AssertionError(f"block {block} has ref count {self.ref_count[block]} but no holder")

    # ---- snapshot ------------------------------------------------------------------------
    def filled_slots(self) -> np.ndarray:
        bs = self.block_size
        # Used and cached blocks are full unless they are some sequence's tail (below).
        full_by_state = np.array([0, bs, bs, 0], dtype=np.int32)  # FREE, USED, CACHED, RESERVED
        filled = full_by_state[self.state]
        tail_blocks: list[int] = []
        tail_fill: list[int] = []
        for track in self.seqs.values():
            computed = track.num_computed_tokens
            for table in track.tables.values():
                for i in range(computed // bs, len(table)):
                    if table[i] != NULL:
                        tail_blocks.append(table[i])
                        tail_fill.append(min(bs, max(0, computed - i * bs)))
        if tail_blocks:
            # A block shared by several tables is partly filled identically in each (a shared
            # partial block exists only right after a fork); max() keeps that exact.
            blocks = np.asarray(tail_blocks, dtype=np.int64)
            filled[blocks] = 0
            np.maximum.at(filled, blocks, np.asarray(tail_fill, dtype=np.int32))
        return filled

    def tokens_stored(self) -> int:
        """Slots holding live sequences' K/V; a shared block counts once, cached ones not at all."""
        cached = int(np.count_nonzero(self.state == BlockState.CACHED))
        return int(self.filled_slots().sum()) - cached * self.block_size

    def snapshot(self) -> KVSnapshot:
        state = self.state.copy()
        ref_count = self.ref_count.copy()
        filled = self.filled_slots()
        counts = np.bincount(state, minlength=len(BlockState))
        used, cached = int(counts[BlockState.USED]), int(counts[BlockState.CACHED])
        reserved = int(counts[BlockState.RESERVED])
        tokens_stored = int(filled.sum()) - cached * self.block_size
        slots_held = (used + reserved) * self.block_size
        num_owners = ref_count.copy()
        if reserved:
            num_owners += state == BlockState.RESERVED
        largest_run, num_runs = free_runs(state)
        statuses = [t.status for t in self.seqs.values()]
        num_preempted = statuses.count("preempted")
        counters = self.counters
        metrics = PoolMetrics(
            blocks_total=self.num_blocks,
            blocks_used=used,
            blocks_free=int(counts[BlockState.FREE]) + cached,
            blocks_cached=cached,
            blocks_reserved=reserved,
            blocks_shared=int(np.count_nonzero(ref_count > 1)),
            tokens_stored=tokens_stored,
            slots_held=slots_held,
            useful_slot_share=tokens_stored / slots_held if slots_held else 1.0,
            internal_waste_slots=slots_held - tokens_stored,
            prefix_query_tokens=counters.prefix_query_tokens,
            prefix_hit_tokens=counters.prefix_hit_tokens,
            prefix_hit_rate=(
                counters.prefix_hit_tokens / counters.prefix_query_tokens
                if counters.prefix_query_tokens
                else 0.0
            ),
            num_running=statuses.count("running"),
            num_waiting=statuses.count("waiting") + num_preempted,
            num_preempted=num_preempted,
            num_preemptions=counters.num_preemptions,
            largest_free_run=largest_run,
            num_free_runs=num_runs,
            group_blocks_used=tuple(
                int(np.count_nonzero((self.group == g) & (state == BlockState.USED)))
                for g in range(len(self.group_windows))
            ),
            blocks_released=counters.blocks_released,
        )
        return KVSnapshot(
            step=self.step,
            timestamp=time.time(),
            allocator=self.allocator,
            block_size=self.block_size,
            num_blocks=self.num_blocks,
            state=state,
            owner=self.owner.copy(),
            num_owners=num_owners,
            ref_count=ref_count,
            filled=filled,
            logical_index=self.logical_index.copy(),
            has_hash=self.has_hash.copy(),
            sequences=tuple(t.info(s) for s, t in self.seqs.items()),
            metrics=metrics,
            group=self.group.copy(),
            group_windows=self.group_windows,
        )
