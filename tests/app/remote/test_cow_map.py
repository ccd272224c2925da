"""CowMap, the remote cache's block map: a dict whose snapshot shares its shards until the
writer changes one, so a snapshot of 100,000 blocks costs a few KiB, not a copy of them."""

from __future__ import annotations

import tracemalloc

from kvscope.app.remote.cow_map import SPLIT_AT, CowMap
from kvscope.app.remote.kv_wire import BlockStored, EventBatch
from kvscope.app.remote.remote_cache import RemoteCache


def test_reads_and_writes_behave_as_a_dict_across_the_split():
    m, d = CowMap(), {}
    for i in range(SPLIT_AT + 500):
        m.set((0, i), i)
        d[(0, i)] = i
    for i in range(0, SPLIT_AT + 500, 3):
        assert m.pop((0, i)) == d.pop((0, i))
    assert m.pop((0, -1), "none") == "none"
    m.set((0, 1), "again")  # an overwrite is no new entry
    d[(0, 1)] = "again"
    assert len(m) == len(d) and dict(m.items()) == d and set(m) == set(d)
    assert sorted(m.values(), key=str) == sorted(d.values(), key=str)
    assert (0, 1) in m and (0, 0) not in m and m.get((0, 0), 7) == 7 and m[(0, 2)] == 2
    m.clear()
    assert len(m) == 0 and list(m) == []


def test_a_snapshot_is_independent_and_costs_no_copy():
    m = CowMap()
    for i in range(100_000):
        m.set(i, i)
    tracemalloc.start()
    try:
        frozen = m.frozen()
        taken = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert taken < 128 << 10, f"a snapshot allocated {taken >> 10} KiB"  # a copy: ~5 MiB
    m.set(1, "changed")
    m.pop(2)
    m.set(-1, "new")
    assert (frozen[1], frozen.get(2), -1 in frozen, len(frozen)) == (1, 2, False, 100_000)
    assert (m[1], m.get(2), m[-1], len(m)) == ("changed", None, "new", 100_000)
    frozen.set(3, "the copy's own")  # a snapshot written to copies its shard too
    assert m[3] == 3


def test_a_cache_snapshot_shares_blocks_until_they_change():
    cache = RemoteCache("r")
    tokens = list(range(1000, 1000 + 40_000 * 4))
    cache.apply(EventBatch(0.0, [BlockStored(list(range(1, 40_001)), None, tokens, 4)]), 0.0)
    tracemalloc.start()
    try:
        snap = cache.copy()
        taken = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert taken < 256 << 10, f"a cache snapshot allocated {taken >> 10} KiB"  # a copy: ~2.5
    cache.apply(EventBatch(1.0, [BlockStored([10**9], None, [1, 2, 3, 4], 4)]), 1.0)
    assert (snap.num_blocks, cache.num_blocks) == (40_000, 40_001)
    assert not snap.holds(10**9) and cache.holds(10**9)
    assert snap.held_prefix_blocks(tokens[:12], 4) == 3


def test_after_a_snapshot_a_slice_of_writes_copies_a_slice_of_the_map():
    """Keys hash at random, so 256 writes touch ~256 shards: they must be a small part."""
    m = CowMap()
    for i in range(200_000):
        m.set(i * 7919, i)
    frozen = m.frozen()
    tracemalloc.start()
    try:
        for i in range(256):  # one slice of RemoteCache.applying
            m.set(-i - 1, i)
        copied = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # The whole map is ~10 MiB of dict; a slice's shards, well under 1.
    assert copied < 1 << 20, f"one slice after a snapshot copied {copied >> 10} KiB"
    assert len(frozen) == 200_000 and len(m) == 200_256
