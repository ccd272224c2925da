"""Checks that the snapshot telemetry mirrors the allocator it observes exactly."""

import numpy as np

from kvscope.engine.kv.contiguous import ContiguousAllocator
from kvscope.engine.kv.paged import PagedAllocator
from kvscope.engine.kv.snapshot import BlockState
from kvscope.engine.kv.telemetry import PoolTelemetry


def _group_tables(bm) -> dict[int, dict[int, list[int]]]:
    """seq_id -> {group: table} of the allocator, sequences with blocks only."""
    if isinstance(bm, PagedAllocator):
        return {
            s: {g: list(t) for g, t in enumerate(tables)}
            for s, tables in bm.group_tables.items()
            if any(b >= 0 for t in tables for b in t)
        }
    return {s: {0: list(t)} for s, t in bm.tables.items() if t}


def assert_telemetry_matches(tel: PoolTelemetry, bm) -> None:
    """Every group's tables, ref counts, states, hash flags and block groups agree."""
    live = {s: t for s, t in tel.seqs.items() if t.status != "finished"}
    expected_tables = _group_tables(bm)
    seen = {
        s: {g: list(table) for g, table in t.tables.items()}
        for s, t in live.items()
        if any(b >= 0 for table in t.tables.values() for b in table)
    }
    assert seen == expected_tables, "telemetry tables differ from the block manager's"
    if isinstance(bm, PagedAllocator):
        refs = np.array([b.ref_count for b in bm.blocks])
        assert np.array_equal(tel.ref_count, refs), "ref counts differ"
        expected = np.full(bm.num_blocks, BlockState.FREE, dtype=np.uint8)
        expected[refs > 0] = BlockState.USED
        expected[list(bm._free_cached)] = BlockState.CACHED
        assert np.array_equal(tel.state, expected), "block states differ"
        hashed = np.array([b.block_hash is not None for b in bm.blocks])
        assert np.array_equal(tel.has_hash, hashed), "hash flags differ"
        groups = np.array(
            [b.group if b.ref_count or b.block_hash is not None else -1 for b in bm.blocks]
        )
        assert np.array_equal(tel.group, groups), "block groups differ"
        assert tel.counters.blocks_released == bm.num_released_blocks, "released counts differ"
    else:
        assert isinstance(bm, ContiguousAllocator)
        held = tel.state != BlockState.FREE
        assert np.array_equal(held, bm.reserved), "reservations differ"
    for b in np.flatnonzero(tel.state == BlockState.USED):
        owner, index = int(tel.owner[b]), int(tel.logical_index[b])
        group = int(tel.group[b])
        table = expected_tables[owner][group]
        assert table[index] == b, f"block {b}: owner {owner} does not hold it in group {group}"
    assert (tel.owner[tel.state == BlockState.FREE] == -1).all()
    snap = tel.snapshot()
    assert snap.metrics.blocks_used == int((tel.state == BlockState.USED).sum())
    assert snap.metrics.blocks_used + snap.metrics.blocks_free + snap.metrics.blocks_reserved == (
        bm.num_blocks
    )
