"""Checks that the snapshot telemetry mirrors the allocator it observes exactly."""

import numpy as np

from engine.kv.block_manager import BlockManager
from engine.kv.contiguous import ContiguousBlockManager
from engine.kv.snapshot import BlockState
from engine.kv.telemetry import PoolTelemetry


def assert_telemetry_matches(tel: PoolTelemetry, bm) -> None:
    live = {s: t for s, t in tel.seqs.items() if t.status != "finished"}
    assert {s: t.table for s, t in live.items() if t.table} == {
        s: t for s, t in bm.tables.items() if t
    }, "telemetry tables differ from the block manager's"
    if isinstance(bm, BlockManager):
        refs = np.array([b.ref_count for b in bm.blocks])
        assert np.array_equal(tel.ref_count, refs), "ref counts differ"
        expected = np.full(bm.num_blocks, BlockState.FREE, dtype=np.uint8)
        expected[refs > 0] = BlockState.USED
        expected[list(bm._free_cached)] = BlockState.CACHED
        assert np.array_equal(tel.state, expected), "block states differ"
        hashed = np.array([b.block_hash is not None for b in bm.blocks])
        assert np.array_equal(tel.has_hash, hashed), "hash flags differ"
    else:
        assert isinstance(bm, ContiguousBlockManager)
        held = tel.state != BlockState.FREE
        assert np.array_equal(held, bm.reserved), "reservations differ"
    for b in np.flatnonzero(tel.state == BlockState.USED):
        owner, index = int(tel.owner[b]), int(tel.logical_index[b])
        assert bm.tables[owner][index] == b, f"block {b}: owner {owner} does not hold it"
    assert (tel.owner[tel.state == BlockState.FREE] == -1).all()
    snap = tel.snapshot()
    assert snap.metrics.blocks_used == int((tel.state == BlockState.USED).sum())
    assert snap.metrics.blocks_used + snap.metrics.blocks_free + snap.metrics.blocks_reserved == (
        bm.num_blocks
    )
