"""Logical-to-physical KV block bookkeeping: block tables, ref counts, prefix hashes, free lists.

Plain data, no tensors: the pool's tensors live in `kv_cache.KVCache`; this class only decides
which physical block holds which sequence's tokens. Blocks are handed out one at a time as a
sequence grows and come back when it finishes, is aborted or is preempted.

Prefix caching: every full block gets a hash chained from its parent's hash and its token ids.
A freed block keeps its hash ("cached") and can be adopted again by a later sequence with the same
prefix, until the pool needs the space: plain free blocks are used first, then the least recently
freed cached block is evicted. Both free lists are insertion-ordered dicts, so taking a block from
the middle (a cache hit on a free block) and evicting the oldest are O(1).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

from engine.kv.allocator import KVAllocator, NoFreeBlocksError, PrefixMatch, check_pool_size
from engine.kv.events import (
    BlockCopiedOnWrite,
    BlockEvicted,
    BlocksAllocated,
    BlocksFreed,
    BlocksHashed,
    EventLog,
    PrefixCacheHit,
    SequenceForked,
)


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    # What a hashed block holds: its tokens and its parent block's hash. A hit compares both, so
    # a hash collision can never serve KV of other tokens or of another position.
    token_ids: tuple[int, ...] | None = None
    parent_hash: int | None = None


class BlockManager(KVAllocator):
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = False,
        cache_salt: bytes = b"",
        events: EventLog | None = None,
    ) -> None:
        check_pool_size(num_blocks)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # Anything that changes what K/V a token produces (model, KV dtype) goes into every hash.
        self.cache_salt = cache_salt
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free_plain: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self.hash_to_block: dict[int, int] = {}
        self.tables: dict[int, list[int]] = {}
        self._hashes: dict[int, list[int]] = {}  # seq_id -> hashes of its full, computed blocks
        self._num_evictions = 0
        self._num_cow_copies = 0
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

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, seq_id: int) -> list[int]:
        return self.tables.get(seq_id, [])

    def cached_block_tokens(self, block_id: int) -> tuple[int, ...] | None:
        return self.blocks[block_id].token_ids

    def num_new_blocks_needed(self, seq_id: int, total_tokens: int) -> int:
        """Blocks to add so that `seq_id` has slots for `total_tokens` tokens."""
        return max(0, self.blocks_for_tokens(total_tokens) - len(self.table(seq_id)))

    def _needs_cow(self, seq_id: int, write_from: int | None) -> bool:
        table = self.table(seq_id)
        if write_from is None or write_from // self.block_size >= len(table):
            return False
        return self.blocks[table[write_from // self.block_size]].ref_count > 1

    def can_grow(self, seq_id: int, total_tokens: int, write_from: int | None = None) -> bool:
        needed = self.num_new_blocks_needed(seq_id, total_tokens)
        return needed + self._needs_cow(seq_id, write_from) <= self.num_free_blocks

    # ---- prefix cache --------------------------------------------------------------------
    def hash_block(self, parent: int | None, token_ids: Sequence[int]) -> int:
        h = xxhash.xxh3_64(self.cache_salt)
        h.update(b"root" if parent is None else parent.to_bytes(8, "little"))
        h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
        return h.intdigest()

    def match_prefix(self, token_ids: Sequence[int]) -> PrefixMatch:
        """The longest run of cached full blocks that starts `token_ids`.

        At most (len - 1) // block_size blocks: the last token is always computed, so the
        request has logits to sample from and never writes into a shared cached block."""
        match = PrefixMatch([], [])
        if not self.enable_prefix_caching:
            return match
        bs = self.block_size
        parent = None
        for i in range((len(token_ids) - 1) // bs):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            h = self.hash_block(parent, tokens)
            block_id = self.hash_to_block.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.token_ids != tokens or block.parent_hash != parent:
                break
            match.block_ids.append(block_id)
            match.hashes.append(h)
            parent = h
        return match

    def can_adopt(self, match: PrefixMatch, total_tokens: int) -> bool:
        """Room for a new sequence that starts with `match` and needs `total_tokens` slots."""
        revived = sum(self.blocks[b].ref_count == 0 for b in match.block_ids)
        new = max(0, self.blocks_for_tokens(total_tokens) - len(match.block_ids))
        return revived + new <= self.num_free_blocks

    def adopt(self, seq_id: int, match: PrefixMatch) -> None:
        """Start `seq_id`'s table with the matched cached blocks (reviving free ones)."""
        assert seq_id not in self.tables, f"sequence {seq_id} already has blocks"
        for block_id in match.block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free_cached[block_id]
            block.ref_count += 1
        self.peak_used_blocks = max(self.peak_used_blocks, self.num_used_blocks)
        self.tables[seq_id] = list(match.block_ids)
        self._hashes[seq_id] = list(match.hashes)
        if match.block_ids:
            self.events.emit(PrefixCacheHit, seq_id=seq_id, blocks=tuple(match.block_ids))

    def cache_full_blocks(self, seq_id: int, token_ids: Sequence[int], num_computed: int) -> None:
        """Hash the sequence's blocks that became full of computed tokens since the last call."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        hashes = self._hashes.setdefault(seq_id, [])
        table = self.tables[seq_id]
        newly_hashed = []
        for i in range(len(hashes), num_computed // bs):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            parent = hashes[-1] if hashes else None
            h = self.hash_block(parent, tokens)
            hashes.append(h)
            block = self.blocks[table[i]]
            # The first block to hold a prefix owns its hash; a twin computed concurrently by
            # another sequence simply stays uncached.
            if block.block_hash is None and h not in self.hash_to_block:
                block.block_hash, block.token_ids, block.parent_hash = h, tokens, parent
                self.hash_to_block[h] = block.block_id
                newly_hashed.append(block.block_id)
        if newly_hashed:
            self.events.emit(BlocksHashed, seq_id=seq_id, blocks=tuple(newly_hashed))

    # ---- mutations -----------------------------------------------------------------------
    def _take_free_block(self) -> Block:
        self.peak_used_blocks = max(self.peak_used_blocks, self.num_used_blocks + 1)
        if self._free_plain:
            block_id, _ = self._free_plain.popitem(last=False)
            return self.blocks[block_id]
        block_id, _ = self._free_cached.popitem(last=False)  # least recently freed
        block = self.blocks[block_id]
        del self.hash_to_block[block.block_hash]
        block.block_hash = block.token_ids = block.parent_hash = None
        self._num_evictions += 1
        self.events.emit(BlockEvicted, block=block_id)
        return block

    def grow(
        self, seq_id: int, total_tokens: int, write_from: int | None = None
    ) -> list[tuple[int, int]]:
        """Give `seq_id` room for `total_tokens`; if the block at `write_from` is shared, swap in a
        private copy first. Returns the (src, dst) block copies the pool must perform."""
        if not self.can_grow(seq_id, total_tokens, write_from):
            raise NoFreeBlocksError(
                f"sequence {seq_id} needs {self.num_new_blocks_needed(seq_id, total_tokens)} "
                f"blocks, only {self.num_free_blocks} free"
            )
        table = self.tables.setdefault(seq_id, [])
        copies = []
        if self._needs_cow(seq_id, write_from):
            index = write_from // self.block_size
            shared = self.blocks[table[index]]
            shared.ref_count -= 1
            private = self._take_free_block()
            private.ref_count = 1
            table[index] = private.block_id
            copies.append((shared.block_id, private.block_id))
            self._num_cow_copies += 1
            self.events.emit(
                BlockCopiedOnWrite,
                seq_id=seq_id,
                index=index,
                src=shared.block_id,
                dst=private.block_id,
            )
        start = len(table)
        for _ in range(self.num_new_blocks_needed(seq_id, total_tokens)):
            block = self._take_free_block()
            block.ref_count = 1
            table.append(block.block_id)
        if len(table) > start:
            new = tuple(table[start:])
            self.events.emit(BlocksAllocated, seq_id=seq_id, blocks=new, start=start)
        return copies

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every block of the parent (ref counts up); copy-on-write later."""
        assert child_id not in self.tables, f"sequence {child_id} already has blocks"
        table = self.tables[parent_id]
        for block_id in table:
            self.blocks[block_id].ref_count += 1
        self.tables[child_id] = list(table)
        self._hashes[child_id] = list(self._hashes.get(parent_id, []))
        self.events.emit(SequenceForked, seq_id=child_id, parent=parent_id, blocks=tuple(table))

    def free(self, seq_id: int) -> list[int]:
        """Drop the sequence's table; blocks whose ref count hits zero return to a free list."""
        table = self.tables.pop(seq_id, [])
        self._hashes.pop(seq_id, None)
        if table:
            self.events.emit(BlocksFreed, seq_id=seq_id, blocks=tuple(table))
        released = []
        # Tail blocks first, so eviction takes a sequence's end before its shared start.
        for block_id in reversed(table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                free_list = self._free_plain if block.block_hash is None else self._free_cached
                free_list[block_id] = None
                released.append(block_id)
        return released

    # ---- invariants ----------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError unless the bookkeeping is exact (tests call it after scenarios)."""
        refs = [0] * self.num_blocks
        for seq_id, table in self.tables.items():
            assert len(set(table)) == len(table), f"sequence {seq_id} maps a block twice: {table}"
            for block_id in table:
                refs[block_id] += 1
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
            if bid in self._free_cached:
                assert block.block_hash is not None, f"cached free block {bid} has no hash"
            if bid in self._free_plain:
                assert block.block_hash is None, f"plain free block {bid} still has a hash"
            if block.block_hash is not None:
                assert self.hash_to_block.get(block.block_hash) == bid, f"block {bid} hash unmapped"
        for h, bid in self.hash_to_block.items():
            assert self.blocks[bid].block_hash == h, f"hash map points {h} at block {bid}"
        assert self.num_free_blocks + sum(r > 0 for r in refs) == self.num_blocks
