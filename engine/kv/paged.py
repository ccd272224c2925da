"""Logical-to-physical KV block bookkeeping: block tables, ref counts, prefix hashes, free lists.

Plain data, no tensors: the pool's tensors live in `kv_cache.KVCache`; this class only decides
which physical block holds which sequence's tokens. Blocks are handed out one at a time as a
sequence grows and come back when it finishes, is aborted or is preempted.

KV groups (`engine.kv.layout`): a model whose layers differ (sliding-window and full attention)
has several groups of layers, and a sequence has one block table per group, all drawing from one
pool. Every table has the same logical length (one entry per `block_size` tokens); a sliding
group's table gives back, while the sequence runs, the blocks wholly before the window of its
next token (`release_outside_window`): their entries become NULL, always a prefix of the table.
A model whose layers attend alike has one group, and everything below reads as it always did.

Prefix caching (the hashes and the hit rule: `engine.kv.prefix_index`): a freed block keeps its
hash ("cached") for a later sequence with the same prefix until the pool needs the space: plain
free blocks go first, then the least recently freed cached one is evicted. Both free lists are
insertion-ordered dicts: a cache hit's take from the middle and an eviction are O(1).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvscope.engine.kv.allocator import (
    NULL_BLOCK,
    KVAllocator,
    NoFreeBlocksError,
    PrefixMatch,
    check_pool_size,
    live_from,
)
from kvscope.engine.kv.block import Block
from kvscope.engine.kv.events import (
    BlockCopiedOnWrite,
    BlockEvicted,
    BlocksAllocated,
    BlocksFreed,
    BlocksHashed,
    BlocksReleased,
    EventLog,
    PrefixCacheHit,
    SequenceForked,
)
from kvscope.engine.kv.layout import KVLayout
from kvscope.engine.kv.prefix_index import PrefixIndex


class PagedAllocator(KVAllocator):
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = False,
        cache_salt: bytes = b"",
        events: EventLog | None = None,
        layout: KVLayout | None = None,
    ) -> None:
        check_pool_size(num_blocks)
        if layout is not None and layout.block_size != block_size:
            raise ValueError(f"layout block size {layout.block_size} is not {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # One full group unless a layout says otherwise (a block's layer count does not matter
        # here; only which groups slide, and by how much).
        self.layout = layout or KVLayout.single(1, block_size)
        self.num_groups = self.layout.num_groups
        self.windows = self.layout.windows
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free_plain: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self.prefix_index = PrefixIndex(self.blocks, self.layout, cache_salt)
        # The index's per-group hash maps, under the name the invariant checks and tests use.
        self._hash_maps = self.prefix_index.maps
        # seq_id -> one table per group, each [physical block or NULL_BLOCK per logical block]
        self.group_tables: dict[int, list[list[int]]] = {}
        self._hashes: dict[int, list[int]] = {}  # seq_id -> hashes of its full, computed blocks
        self._num_evictions = 0
        self._num_cow_copies = 0
        self._num_released = 0
        self.peak_used_blocks = 0
        # Observers (KVSnapshot telemetry, the contiguous shadow, recorders) follow this stream;
        # a manager built alone (tests) gets a log of its own.
        self.events = events if events is not None else EventLog()

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free_plain) + len(self._free_cached)

    @property
    def num_cached_blocks(self) -> int:
        """Free blocks that still hold a reusable prefix."""
        return len(self._free_cached)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_evictions(self) -> int:
        return self._num_evictions

    @property
    def num_cow_copies(self) -> int:
        return self._num_cow_copies

    @property
    def num_released_blocks(self) -> int:
        """Blocks given back early (out of a sliding window), ever."""
        return self._num_released

    @property
    def hash_to_block(self) -> dict[int, int]:
        """Group 0's prefix hash -> block map (the only one for a single-group model)."""
        return self._hash_maps[0]

    @property
    def tables(self) -> dict[int, list[int]]:
        """seq_id -> its group 0 table (the only one for a single-group model)."""
        return {s: t[0] for s, t in self.group_tables.items()}

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, seq_id: int) -> list[int]:
        tables = self.group_tables.get(seq_id)
        return tables[0] if tables else []

    def tables_of(self, seq_id: int) -> tuple[tuple[int, ...], ...]:
        tables = self.group_tables.get(seq_id)
        if tables is None:
            return ((),) * self.num_groups
        return tuple(tuple(t) for t in tables)

    def cached_block_tokens(self, block_id: int) -> tuple[int, ...] | None:
        return self.blocks[block_id].token_ids

    def num_new_blocks_needed(self, seq_id: int, total_tokens: int) -> int:
        """Blocks to add, over all groups, so that `seq_id` has slots for `total_tokens`."""
        length = len(self.table(seq_id))
        return self.num_groups * max(0, self.blocks_for_tokens(total_tokens) - length)

    def _shared_at(self, seq_id: int, write_from: int | None) -> list[int]:
        """Groups whose block at `write_from` is shared (a write there copies it first)."""
        tables = self.group_tables.get(seq_id)
        if write_from is None or not tables or write_from // self.block_size >= len(tables[0]):
            return []
        index = write_from // self.block_size
        return [
            g
            for g, table in enumerate(tables)
            if table[index] != NULL_BLOCK and self.blocks[table[index]].ref_count > 1
        ]

    def can_grow(self, seq_id: int, total_tokens: int, write_from: int | None = None) -> bool:
        needed = self.num_new_blocks_needed(seq_id, total_tokens)
        return needed + len(self._shared_at(seq_id, write_from)) <= self.num_free_blocks

    # ---- prefix cache --------------------------------------------------------------------
    def match_prefix(self, token_ids: Sequence[int]) -> PrefixMatch:
        """The longest cached prefix of `token_ids` that every group can resume from
        (`PrefixIndex.match`); nothing while prefix caching is off."""
        if not self.enable_prefix_caching:
            return PrefixMatch([], [])
        return self.prefix_index.match(token_ids)

    def can_adopt(self, match: PrefixMatch, total_tokens: int) -> bool:
        """Room for a new sequence that starts with `match` and needs `total_tokens` slots."""
        revived = sum(
            b != NULL_BLOCK and self.blocks[b].ref_count == 0
            for table in match.group_ids(self.num_groups)
            for b in table
        )
        n = match.num_blocks
        new = self.num_groups * max(0, self.blocks_for_tokens(total_tokens) - n)
        return revived + new <= self.num_free_blocks

    def adopt(self, seq_id: int, match: PrefixMatch) -> None:
        """Start `seq_id`'s tables with the matched cached blocks (reviving free ones)."""
        assert seq_id not in self.group_tables, f"sequence {seq_id} already has blocks"
        tables = [list(t) for t in match.group_ids(self.num_groups)]
        for table in tables:
            for block_id in table:
                if block_id == NULL_BLOCK:
                    continue
                block = self.blocks[block_id]
                if block.ref_count == 0:
                    del self._free_cached[block_id]
                block.ref_count += 1
        self.peak_used_blocks = max(self.peak_used_blocks, self.num_used_blocks)
        self.group_tables[seq_id] = tables
        self._hashes[seq_id] = list(match.hashes)
        for g, table in enumerate(tables):
            start = live_from(table)
            if start < len(table):
                self.events.emit(
                    PrefixCacheHit, seq_id=seq_id, blocks=tuple(table[start:]), group=g, start=start
                )

    def cache_full_blocks(self, seq_id: int, token_ids: Sequence[int], num_computed: int) -> None:
        """Hash the sequence's blocks that became full of computed tokens since the last call."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        hashes = self._hashes.setdefault(seq_id, [])
        tables = self.group_tables[seq_id]
        newly_hashed = []
        for i in range(len(hashes), num_computed // bs):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            parent = hashes[-1] if hashes else None
            h = self.prefix_index.hash_block(parent, tokens)
            hashes.append(h)
            for g, table in enumerate(tables):
                if table[i] == NULL_BLOCK:
                    continue  # already given back by its window
                block = self.blocks[table[i]]
                if self.prefix_index.add(g, block, h, tokens, parent):
                    newly_hashed.append(block.block_id)
        if newly_hashed:
            self.events.emit(BlocksHashed, seq_id=seq_id, blocks=tuple(newly_hashed))

    # ---- mutations -----------------------------------------------------------------------
    def _take_free_block(self, group: int) -> Block:
        self.peak_used_blocks = max(self.peak_used_blocks, self.num_used_blocks + 1)
        if self._free_plain:
            block_id, _ = self._free_plain.popitem(last=False)
            block = self.blocks[block_id]
        else:
            block_id, _ = self._free_cached.popitem(last=False)  # least recently freed
            block = self.blocks[block_id]
            self.prefix_index.drop(block)
            self._num_evictions += 1
            self.events.emit(BlockEvicted, block=block_id)
        block.group = group
        return block

    def _unref(self, block_id: int) -> bool:
        """One table reference fewer; True when the block went back to a free list."""
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count:
            return False
        free_list = self._free_plain if block.block_hash is None else self._free_cached
        free_list[block_id] = None
        return True

    def grow(
        self, seq_id: int, total_tokens: int, write_from: int | None = None
    ) -> list[tuple[int, int]]:
        """Give `seq_id` room for `total_tokens` in every group; if a block at `write_from` is
        shared, swap in a private copy first. Returns the (src, dst) copies the pool must do."""
        tables = self.group_tables.get(seq_id)
        if tables and self.blocks_for_tokens(total_tokens) <= len(tables[0]):
            if not self._shared_at(seq_id, write_from):
                return []  # most decode steps: room in the last block, nothing shared to copy
        if not self.can_grow(seq_id, total_tokens, write_from):
            raise NoFreeBlocksError(
                f"sequence {seq_id} needs {self.num_new_blocks_needed(seq_id, total_tokens)} "
                f"blocks, only {self.num_free_blocks} free"
            )
        shared = self._shared_at(seq_id, write_from)
        tables = self.group_tables.setdefault(seq_id, [[] for _ in range(self.num_groups)])
        needed = max(0, self.blocks_for_tokens(total_tokens) - len(tables[0]))
        copies = []
        for g in shared:
            assert write_from is not None  # _shared_at finds none without a write position
            index = write_from // self.block_size
            src = tables[g][index]
            self.blocks[src].ref_count -= 1
            private = self._take_free_block(g)
            private.ref_count = 1
            tables[g][index] = private.block_id
            copies.append((src, private.block_id))
            self._num_cow_copies += 1
            self.events.emit(
                BlockCopiedOnWrite,
                seq_id=seq_id,
                index=index,
                src=src,
                dst=private.block_id,
                group=g,
            )
        for g, table in enumerate(tables):
            start = len(table)
            for _ in range(needed):
                block = self._take_free_block(g)
                block.ref_count = 1
                table.append(block.block_id)
            if needed:
                new = tuple(table[start:])
                self.events.emit(BlocksAllocated, seq_id=seq_id, blocks=new, start=start, group=g)
        return copies

    def release_outside_window(self, seq_id: int, next_position: int) -> list[int]:
        """Give back every sliding-group block wholly before the window of the token at
        `next_position` (the sequence's next to compute); returns the blocks that became free.
        Shared blocks only lose this sequence's reference."""
        tables = self.group_tables.get(seq_id)
        if not tables:
            return []
        freed = []
        for g, table in enumerate(tables):
            if self.windows[g] is None:
                continue  # a full-attention group keeps every block
            first = min(self.layout.first_needed_block(g, next_position), len(table))
            start = live_from(table, first)
            if start >= first:
                continue
            released = tuple(table[start:first])
            table[start:first] = [NULL_BLOCK] * (first - start)
            self.events.emit(BlocksReleased, seq_id=seq_id, blocks=released, start=start, group=g)
            self._num_released += len(released)
            # The oldest first: a cached one among them is then the first evicted.
            freed += [b for b in released if self._unref(b)]
        return freed

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every block of the parent (ref counts up); copy-on-write later."""
        assert child_id not in self.group_tables, f"sequence {child_id} already has blocks"
        tables = [list(t) for t in self.group_tables[parent_id]]
        for table in tables:
            for block_id in table:
                if block_id != NULL_BLOCK:
                    self.blocks[block_id].ref_count += 1
        self.group_tables[child_id] = tables
        self._hashes[child_id] = list(self._hashes.get(parent_id, []))
        for g, table in enumerate(tables):
            start = live_from(table)
            self.events.emit(
                SequenceForked,
                seq_id=child_id,
                parent=parent_id,
                blocks=tuple(table[start:]),
                group=g,
                start=start,
            )

    def free(self, seq_id: int) -> list[int]:
        """Drop the sequence's tables; blocks whose ref count hits zero return to a free list."""
        tables = self.group_tables.pop(seq_id, None) or []
        self._hashes.pop(seq_id, None)
        released = []
        for g, table in enumerate(tables):
            start = live_from(table)
            if start < len(table):
                self.events.emit(
                    BlocksFreed, seq_id=seq_id, blocks=tuple(table[start:]), group=g, start=start
                )
            # Tail blocks first, so eviction takes a sequence's end before its shared start.
            released += [b for b in reversed(table[start:]) if self._unref(b)]
        return released

    # ---- invariants ----------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError unless the bookkeeping is exact (tests call it after scenarios)."""
        refs = [0] * self.num_blocks
        group_of = [-1] * self.num_blocks
        for seq_id, tables in self.group_tables.items():
            assert len(tables) == self.num_groups, f"sequence {seq_id} has {len(tables)} tables"
            assert len({len(t) for t in tables}) == 1, f"sequence {seq_id}: tables differ in length"
            for g, table in enumerate(tables):
                start = live_from(table)
                live = table[start:]
                assert NULL_BLOCK not in live, f"sequence {seq_id} group {g}: a hole {table}"
                assert start == 0 or self.windows[g] is not None, (
                    f"sequence {seq_id}: full-attention group {g} released blocks"
                )
                assert len(set(live)) == len(live), f"sequence {seq_id} maps a block twice: {table}"
                for block_id in live:
                    refs[block_id] += 1
                    assert group_of[block_id] in (-1, g), f"block {block_id} is in two groups"
                    group_of[block_id] = g
        assert not self._free_plain.keys() & self._free_cached.keys(), "block on two free lists"
        for block in self.blocks:
            bid = block.block_id
            in_free = bid in self._free_plain or bid in self._free_cached
            assert block.ref_count == refs[bid], (
                f"block {bid}: ref_count {block.ref_count} but {refs[bid]} table references"
            )
            assert in_free == (block.ref_count == 0), (
                f"block {bid}: ref_count {block.ref_count}, in free list {in_free}"
            )
            if block.ref_count:
                assert block.group == group_of[bid], (
                    f"block {bid} says group {block.group}, tables of group {group_of[bid]}"
                )
            if bid in self._free_cached:
                assert block.block_hash is not None, f"cached free block {bid} has no hash"
            if bid in self._free_plain:
                assert block.block_hash is None, f"plain free block {bid} still has a hash"
            if block.block_hash is not None:
                assert self._hash_maps[block.group].get(block.block_hash) == bid, (
                    f"block {bid} hash unmapped"
                )
        for g, hash_map in enumerate(self._hash_maps):
            for h, bid in hash_map.items():
                assert self.blocks[bid].block_hash == h, f"hash map points {h} at block {bid}"
                assert self.blocks[bid].group == g, f"group {g}'s hash map holds block {bid}"
        assert self.num_free_blocks + sum(r > 0 for r in refs) == self.num_blocks
