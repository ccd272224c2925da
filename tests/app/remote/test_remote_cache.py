"""RemoteCache: a replica's cached blocks rebuilt from its events, drawn as a prefix tree."""

from __future__ import annotations

from kvscope.app.remote.kv_wire import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from kvscope.app.remote.remote_cache import HISTORY_MAX, RemoteCache

BS = 2


def stored(hashes, parent, tokens, group=0, medium="GPU"):
    return BlockStored(hashes, parent, tokens, BS, group_idx=group, medium=medium)


def apply(cache: RemoteCache, now: float, *events) -> None:
    """Events in a batch the server stamped at `now`, received at `now`."""
    cache.apply(EventBatch(ts=now, events=list(events)), now=now)


def shared_prefix_cache() -> RemoteCache:
    """Two prompts sharing blocks 1-2, then branching: 1-2-3-4 and 1-2-5."""
    cache = RemoteCache("r0")
    apply(cache, 1.0, stored([1, 2, 3, 4], None, [10, 11, 12, 13, 14, 15, 16, 17]))
    apply(cache, 2.0, stored([5], 2, [20, 21]))
    return cache


def test_store_remove_clear_and_history():
    cache = shared_prefix_cache()
    assert cache.num_blocks == 5 and cache.block_size == BS
    block = cache.blocks[(0, 3)]
    assert (block.parent_hash, block.token_ids, block.stored_at) == (2, (14, 15), 1.0)
    apply(cache, 3.0, BlockRemoved([4, 99]))  # 99 was never announced
    assert not cache.holds(4) and cache.unknown_removals == 1 and cache.removed_total == 1
    apply(cache, 4.0, AllBlocksCleared(), stored([7], None, [1, 2]))
    assert list(cache.blocks) == [(0, 7)] and cache.clears == 1
    assert cache.history == [(1.0, 4), (2.0, 5), (3.0, 4), (4.0, 1)]


def test_tree_branches_counts_and_orphans():
    cache = shared_prefix_cache()
    # Block 9's parent (8) was stored before we listened: an orphan root.
    apply(cache, 3.0, stored([9], 8, [30, 31]))
    roots = cache.tree()
    assert [r.block.hash for r in roots] == [1, 9]
    main, orphan = roots
    assert (main.subtree_blocks, main.orphan, orphan.orphan) == (5, False, True)
    (two,) = main.children
    assert [c.block.hash for c in two.children] == [3, 5]  # the bigger branch first
    assert [c.subtree_blocks for c in two.children] == [2, 1]
    assert two.children[0].children[0].depth == 3


def test_groups_and_other_media_are_kept_apart():
    cache = RemoteCache("r")
    apply(cache, 0.0, stored([1], None, [1, 2], group=0), stored([1], None, [1, 2], group=1))
    apply(cache, 0.0, stored([2], None, [3, 4], medium="CPU"))  # an offload tier
    assert set(cache.blocks) == {(0, 1), (1, 1)} and cache.groups() == [0, 1]
    assert cache.other_medium_events == 1
    apply(cache, 0.0, BlockRemoved([1], group_idx=1))
    assert set(cache.blocks) == {(0, 1)}
    assert [r.block.hash for r in cache.tree(group=1)] == []


def test_held_prefix_blocks_by_token_content():
    cache = shared_prefix_cache()
    assert cache.held_prefix_blocks([10, 11, 12, 13, 14, 15, 16, 17, 99], BS) == 4
    assert cache.held_prefix_blocks([10, 11, 12, 13, 20, 21], BS) == 3
    assert cache.held_prefix_blocks([10, 11, 99, 13, 14, 15], BS) == 1  # stops at the miss
    assert cache.held_prefix_blocks([12, 13], BS) == 0  # block 2's tokens, but not at the start
    assert cache.held_prefix_blocks([10, 11, 12, 13], 4) == 0  # another block size
    apply(cache, 3.0, BlockRemoved([2]))
    assert cache.held_prefix_blocks([10, 11, 12, 13, 14, 15], BS) == 1


def test_copy_is_independent_and_history_is_bounded():
    cache = shared_prefix_cache()
    snap = cache.copy()
    apply(cache, 5.0, AllBlocksCleared())
    assert snap.num_blocks == 5 and cache.num_blocks == 0
    assert snap.held_prefix_blocks([10, 11], BS) == 1 and snap.version < cache.version
    for i in range(HISTORY_MAX + 10):
        apply(cache, float(i))
    assert len(cache.history) <= HISTORY_MAX
    assert cache.history[-1] == (float(HISTORY_MAX + 9), 0)


def test_a_long_conversation_is_one_deep_chain():
    cache = RemoteCache("r")
    n = 5000  # deeper than Python's recursion limit
    apply(cache, 0.0, stored(list(range(1, n + 1)), None, list(range(n * BS))))
    (root,) = cache.tree()
    assert root.subtree_blocks == n
    node = root
    while node.children:
        node = node.children[0]
    assert node.depth == n - 1 and node.block.hash == n


def test_history_points_are_coalesced_per_step():
    cache = RemoteCache("r")
    for i, now in enumerate((10.0, 10.1, 10.2, 10.3)):
        apply(cache, now, stored([i + 1], i or None, [i, i]))
    assert cache.history == [(10.0, 3), (10.3, 4)]


def test_the_servers_timestamps_date_replayed_history():
    cache = RemoteCache("r")
    now = 1_000_000.0
    cache.apply(EventBatch(ts=now - 600, events=[stored([1], None, [1, 2])]), now=now)
    cache.apply(EventBatch(ts=now + 3600, events=[stored([2], 1, [3, 4])]), now=now)  # skewed
    assert [b.stored_at for b in cache.blocks.values()] == [now - 600, now]
    assert cache.history == [(now - 600, 1), (now, 2)]
