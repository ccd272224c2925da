"""Pools of any size in realistic states, for the map's benchmark and its screenshots: a few
chats whose tables lie in runs scattered over the pool (a long-running allocator reuses blocks
wherever they free up), a system-prompt prefix shared by three of them, a scatter of cached
blocks, mostly free space; and the naive allocator's view of the same sequences (contiguous
reservations of the whole context, a few blocks written)."""

from __future__ import annotations

import numpy as np

from kvscope.engine.kv.snapshot import BlockState, KVSnapshot, PoolMetrics, SequenceInfo, free_runs

BLOCK_SIZE = 16
SHARED_PREFIX_BLOCKS = 4


def pool_snapshot(
    allocator: str,
    state: np.ndarray,
    owner: np.ndarray,
    ref: np.ndarray,
    filled: np.ndarray,
    sequences: tuple[SequenceInfo, ...],
) -> KVSnapshot:
    """A snapshot of these per-block arrays, its metrics counted from them."""
    n = len(state)
    used, reserved = state == BlockState.USED, state == BlockState.RESERVED
    cached = state == BlockState.CACHED
    stored, held = int(filled[used].sum()), int((used | reserved).sum()) * BLOCK_SIZE
    largest, runs = free_runs(state)
    metrics = PoolMetrics(
        blocks_total=n,
        blocks_used=int(used.sum()),
        blocks_free=int((state == BlockState.FREE).sum() + cached.sum()),
        blocks_cached=int(cached.sum()),
        blocks_reserved=int(reserved.sum()),
        blocks_shared=int((ref > 1).sum()),
        tokens_stored=stored,
        slots_held=held,
        useful_slot_share=stored / held if held else 1.0,
        internal_waste_slots=held - stored,
        prefix_query_tokens=0,
        prefix_hit_tokens=0,
        prefix_hit_rate=0.0,
        num_running=len(sequences),
        num_waiting=0,
        num_preempted=0,
        num_preemptions=0,
        largest_free_run=largest,
        num_free_runs=runs,
    )
    logical = np.full(n, -1, np.int32)
    for s in sequences:
        blocks = s.block_table or s.reserved_blocks
        logical[np.asarray(blocks, dtype=np.int64)] = np.arange(len(blocks), dtype=np.int32)
    return KVSnapshot(
        1,
        0.0,
        allocator,
        BLOCK_SIZE,
        n,
        state,
        owner,
        ref,
        ref.copy(),
        filled,
        logical,
        (filled == BLOCK_SIZE) & (used | cached),
        sequences,
        metrics,
    )


def realistic_pool(num_blocks: int, num_seqs: int = 6, seed: int = 0) -> KVSnapshot:
    """A paged pool: `num_seqs` chats holding up to about 40% of a small pool (at most 3,000
    blocks of a large one) in scattered runs, three sharing a prefix, ~1% cached."""
    rng = np.random.default_rng(seed)
    n = num_blocks
    state = np.zeros(n, np.uint8)
    owner = np.full(n, -1, np.int64)
    ref = np.zeros(n, np.int32)
    filled = np.zeros(n, np.int32)
    free = np.ones(n, dtype=bool)

    def take(count: int) -> list[int]:
        """`count` free blocks in runs of 2 to 24 starting at random free places."""
        out: list[int] = []
        while len(out) < count and free.any():
            starts = np.flatnonzero(free)
            at = int(starts[rng.integers(len(starts))])
            run = np.arange(at, min(n, at + int(rng.integers(2, 25))))
            run = run[free[run]][: count - len(out)]
            free[run] = False
            out.extend(int(b) for b in run)
        return out

    budget = max(num_seqs * 3, min(int(0.4 * n), 3_000))
    prefix = take(SHARED_PREFIX_BLOCKS) if n >= 16 else []
    sequences = []
    for seq_id in range(1, num_seqs + 1):
        own = take(max(1, int(budget / num_seqs * rng.uniform(0.5, 1.5))))
        table = (prefix if seq_id <= 3 else []) + own
        tokens = (len(table) - 1) * BLOCK_SIZE + int(rng.integers(1, BLOCK_SIZE + 1))
        for block in table:
            if ref[block] == 0:
                owner[block] = seq_id
            ref[block] += 1
        state[table] = BlockState.USED
        filled[table] = BLOCK_SIZE
        filled[table[-1]] = tokens - (len(table) - 1) * BLOCK_SIZE
        sequences.append(
            SequenceInfo(
                seq_id, f"conv-{seq_id}/r0", 0, "running", tokens, tokens, tokens, 0, tuple(table)
            )
        )
    cached = take(max(3, min(n // 100, 400)))
    state[cached], filled[cached] = BlockState.CACHED, BLOCK_SIZE
    return pool_snapshot("paged", state, owner, ref, filled, tuple(sequences))


def naive_shadow(paged: KVSnapshot, context_blocks: int = 128) -> KVSnapshot:
    """The contiguous allocator's view of `paged`'s sequences: each reserves its context
    (`context_blocks`, or half as much again as it has written when that is more; less in a
    small pool) in a row, with a hole after each where a finished reservation was."""
    n = paged.num_blocks
    room = max(2, n // (len(paged.sequences) + 2))
    state = np.zeros(n, np.uint8)
    owner = np.full(n, -1, np.int64)
    ref = np.zeros(n, np.int32)
    filled = np.zeros(n, np.int32)
    sequences = []
    at = 0
    for s in paged.sequences:
        needed = -(-s.num_tokens // BLOCK_SIZE)
        per_seq = min(room, max(context_blocks, needed + needed // 2))
        if at + per_seq > n:
            break
        reserved = np.arange(at, at + per_seq)
        written = min(per_seq, needed)
        state[reserved], owner[reserved] = BlockState.RESERVED, s.seq_id
        state[reserved[:written]], ref[reserved[:written]] = BlockState.USED, 1
        filled[reserved[:written]] = BLOCK_SIZE
        table = tuple(int(b) for b in reserved[:written])
        sequences.append(
            SequenceInfo(
                s.seq_id,
                s.request_id,
                0,
                "running",
                s.num_prompt_tokens,
                s.num_tokens,
                s.num_tokens,
                0,
                table,
                reserved_blocks=tuple(int(b) for b in reserved),
            )
        )
        at += per_seq + per_seq // 3  # a hole where a finished sequence's reservation was
    return pool_snapshot("contiguous-shadow", state, owner, ref, filled, tuple(sequences))
