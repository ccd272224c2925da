"""KV snapshots built by hand from block tables, as the engine's telemetry would publish them:
what the block map tests (and the window tests that draw a known pool) feed the map."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from kvscope.engine.kv.snapshot import BlockState, KVSnapshot, PoolMetrics, SequenceInfo, free_runs

BS = 16


@dataclass
class Seq:
    seq_id: int
    request_id: str
    table: tuple[int, ...]
    num_tokens: int
    reserved: tuple[int, ...] = ()
    status: str = "running"
    num_prompt_tokens: int = 0
    index: int = 0


def make_snapshot(
    num_blocks: int,
    seqs: list[Seq],
    cached: tuple[int, ...] = (),
    allocator: str = "paged",
    waiting: int = 0,
    prefix: tuple[int, int] = (0, 0),
    step: int = 1,
) -> KVSnapshot:
    """A snapshot as the engine's telemetry would publish it, built from block tables."""
    state = np.zeros(num_blocks, np.uint8)
    owner = np.full(num_blocks, -1, np.int64)
    ref = np.zeros(num_blocks, np.int32)
    filled = np.zeros(num_blocks, np.int32)
    logical = np.full(num_blocks, -1, np.int32)
    has_hash = np.zeros(num_blocks, bool)
    for b in cached:
        state[b], filled[b], has_hash[b] = BlockState.CACHED, BS, True
    for s in seqs:
        for i, b in enumerate(s.reserved):
            state[b], owner[b], logical[b] = BlockState.RESERVED, s.seq_id, i
    for s in seqs:
        for i, b in enumerate(s.table):
            if ref[b] == 0:
                owner[b], logical[b] = s.seq_id, i
            state[b] = BlockState.USED
            ref[b] += 1
            filled[b] = max(filled[b], min(BS, max(0, s.num_tokens - i * BS)))
            has_hash[b] |= filled[b] == BS and allocator == "paged"
    used = state == BlockState.USED
    reserved = state == BlockState.RESERVED
    stored = int(filled[used].sum())
    held = int((used | reserved).sum()) * BS
    largest, runs = free_runs(state)
    statuses = [s.status for s in seqs]
    metrics = PoolMetrics(
        blocks_total=num_blocks,
        blocks_used=int(used.sum()),
        blocks_free=int((state == BlockState.FREE).sum() + (state == BlockState.CACHED).sum()),
        blocks_cached=int((state == BlockState.CACHED).sum()),
        blocks_reserved=int(reserved.sum()),
        blocks_shared=int((ref > 1).sum()),
        tokens_stored=stored,
        slots_held=held,
        useful_slot_share=stored / held if held else 1.0,
        internal_waste_slots=held - stored,
        prefix_query_tokens=prefix[1],
        prefix_hit_tokens=prefix[0],
        prefix_hit_rate=prefix[0] / prefix[1] if prefix[1] else 0.0,
        num_running=statuses.count("running"),
        num_waiting=statuses.count("waiting") + waiting,
        num_preempted=statuses.count("preempted"),
        num_preemptions=0,
        largest_free_run=largest,
        num_free_runs=runs,
    )
    infos = tuple(
        SequenceInfo(
            s.seq_id, s.request_id, s.index, s.status, s.num_prompt_tokens or s.num_tokens,
            s.num_tokens, s.num_tokens, 0, s.table, s.reserved,
        )
        for s in seqs
    )  # fmt: skip
    return KVSnapshot(
        step, time.time(), allocator, BS, num_blocks, state, owner, ref + reserved, ref, filled,
        logical, has_hash, infos, metrics,
    )  # fmt: skip


def small_pool() -> KVSnapshot:
    """Blocks: 0-1 shared prompt of A and B (ref 2); 2 A's full tail; 3 A's partial (5/16);
    4 B's last block (16/16); 5 cached; 6 free; 7 reserved by C; 8 free."""
    seqs = [
        Seq(1, "conv-1/a", (0, 1, 2, 3), 3 * BS + 5),
        Seq(2, "load-2/0", (0, 1, 4), 3 * BS),
        Seq(3, "load-3/0", (), 0, reserved=(7,)),
    ]
    return make_snapshot(9, seqs, cached=(5,))
