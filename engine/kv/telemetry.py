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

from engine.kv.events import (
    BlockCopiedOnWrite,
    BlockEvicted,
    BlocksAllocated,
    BlocksFreed,
    BlocksHashed,
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
from engine.kv.snapshot import BlockState, KVSnapshot, PoolMetrics, SequenceInfo, free_runs


@dataclass
class SequenceTrack:
    request_id: str
    index: int
    num_prompt_tokens: int
    num_tokens: int
    status: str = "waiting"
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    table: list[int] = field(default_factory=list)
    reserved: tuple[int, ...] = ()
    finished_step: int | None = None

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
            block_table=tuple(self.table),
            reserved_blocks=self.reserved,
        )


@dataclass
class PoolCounters:
    """Cumulative counts of the pool's traffic. The telemetry owns them (it sees every event);
    `stats()` and the snapshot's metrics both read them from here."""

    num_preemptions: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0


class PoolTelemetry:
    def __init__(self, num_blocks: int, block_size: int, allocator: str = "paged") -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.allocator = allocator
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
        self.counters.prefix_query_tokens += e.query_tokens
        self.counters.prefix_hit_tokens += e.hit_tokens

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
        table = self.seqs[e.seq_id].table
        del table[e.start :]
        table.extend(e.blocks)

    def _on_cache_hit(self, e: PrefixCacheHit) -> None:
        for i, b in enumerate(e.blocks):
            if self.ref_count[b] == 0:
                self.state[b] = BlockState.USED
                self.owner[b] = e.seq_id
                self.logical_index[b] = i
            self.ref_count[b] += 1
        self.seqs[e.seq_id].table = list(e.blocks)

    def _on_hashed(self, e: BlocksHashed) -> None:
        self.has_hash[list(e.blocks)] = True

    def _on_evicted(self, e: BlockEvicted) -> None:
        self.has_hash[e.block] = False
        self.state[e.block] = BlockState.FREE

    def _on_copied(self, e: BlockCopiedOnWrite) -> None:
        src, dst = e.src, e.dst
        self.seqs[e.seq_id].table[e.index] = dst
        self.ref_count[src] -= 1
        if self.owner[src] == e.seq_id:
            self._reassign_owner(src, e.index, e.seq_id)
        self.state[dst] = BlockState.USED
        self.ref_count[dst] = 1
        self.owner[dst] = e.seq_id
        self.logical_index[dst] = e.index

    def _on_forked(self, e: SequenceForked) -> None:
        self.ref_count[list(e.blocks)] += 1
        child = self.seqs[e.seq_id]
        parent = self.seqs[e.parent]
        child.table = list(e.blocks)
        child.status = "running"
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens

    def _on_freed(self, e: BlocksFreed) -> None:
        track = self.seqs[e.seq_id]
        for i, b in enumerate(e.blocks):
            self.ref_count[b] -= 1
            if self.ref_count[b] == 0:
                self.state[b] = BlockState.CACHED if self.has_hash[b] else BlockState.FREE
                self.owner[b] = -1
                self.logical_index[b] = -1
            elif self.owner[b] == e.seq_id:
                self._reassign_owner(b, i, e.seq_id)
        if track.reserved:
            rest = np.asarray(track.reserved[len(e.blocks) :], dtype=np.int64)
            self.state[rest] = BlockState.FREE
            self.owner[rest] = -1
            self.logical_index[rest] = -1
            track.reserved = ()
        track.table = []

    def _on_preempted(self, e: SequencePreempted) -> None:
        track = self.seqs[e.seq_id]
        track.status = "preempted"
        track.num_computed_tokens = 0
        self.counters.num_preemptions += 1

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
        SequencePreempted: _on_preempted,
        SequenceFinished: _on_finished,
        StepProgress: _on_progress,
    }

    def _reassign_owner(self, block: int, index: int, leaving: int) -> None:
        # A shared block sits at the same logical index in every table holding it (prefix
        # matches and forks both keep positions), so one probe per sequence finds the next owner.
        for seq_id, track in self.seqs.items():
            if seq_id != leaving and index < len(track.table) and track.table[index] == block:
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
            table = track.table
            computed = track.num_computed_tokens
            for i in range(computed // bs, len(table)):
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
        )
