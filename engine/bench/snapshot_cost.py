"""What a KVSnapshot costs on a full pool of 100,000 blocks, for `kvscope bench`.

A model with a pool that size would hold tens of GB of K/V, so none is built: the pool's
observers (the telemetry behind `kv_snapshot()`, the contiguous shadow behind
`shadow_snapshot()`) are fed the events a full pool of 64 sequences produces, then timed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from kvscope.engine.kv.events import BlocksAllocated, SequenceAdded, SequenceAdmitted, StepProgress
from kvscope.engine.kv.observers import PoolObservers

SNAPSHOT_BLOCKS = 100_000
SNAPSHOT_TARGET_MS = 5.0
BLOCK_SIZE = 16
NUM_SEQUENCES = 64


def measure_snapshot_cost(
    num_blocks: int = SNAPSHOT_BLOCKS, repeats: int = 21
) -> dict[str, int | float | bool]:
    """Fill a pool of `num_blocks` through the event stream, then time snapshots of it."""
    per_seq = num_blocks // NUM_SEQUENCES
    pool = PoolObservers(num_blocks, BLOCK_SIZE, "paged", per_seq * BLOCK_SIZE)
    log = pool.events
    lens = []
    for s in range(NUM_SEQUENCES):
        tokens = per_seq * BLOCK_SIZE - 5  # a partly filled last block each
        log.emit(
            SequenceAdded, seq_id=s, request_id=f"load-{s}/0", sample=0, num_prompt_tokens=tokens
        )
        log.emit(SequenceAdmitted, seq_id=s, query_tokens=tokens, hit_tokens=0, first=True)
        blocks = tuple(range(s * per_seq, (s + 1) * per_seq))
        log.emit(BlocksAllocated, seq_id=s, blocks=blocks, start=0)
        lens.append((s, tokens, tokens))
    log.step = 1
    log.emit(StepProgress, lens=tuple(lens))

    pool_ms = _timed(pool.snapshot, repeats)
    shadow_ms = _timed(pool.shadow_snapshot, repeats)
    return {
        "num_blocks": num_blocks,
        "num_sequences": NUM_SEQUENCES,
        "blocks_used": pool.snapshot().metrics.blocks_used,
        "snapshot_ms_median": float(np.median(pool_ms)),
        "snapshot_ms_min": float(np.min(pool_ms)),
        "shadow_snapshot_ms_median": float(np.median(shadow_ms)),
        "target_ms": SNAPSHOT_TARGET_MS,
        "met": float(np.median(pool_ms)) < SNAPSHOT_TARGET_MS,
    }


def _timed(fn: Callable[[], object], repeats: int) -> list[float]:
    """Milliseconds of each of `repeats` calls."""
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1e3)
    return out
