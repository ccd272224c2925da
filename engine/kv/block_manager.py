"""Logical-to-physical KV block bookkeeping: block tables, ref counts and the free list.

Plain data, no tensors: the pool's tensors live in `kv_cache.KVCache`; this class only decides which
physical block holds which sequence's tokens. Blocks are handed out one at a time as a sequence
grows and come back when it finishes, is aborted or is preempted.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


class NoFreeBlocksError(RuntimeError):
    """Raised when an allocation is attempted without checking capacity first."""


@dataclass
class Block:
    block_id: int
    ref_count: int = 0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Insertion-ordered: O(1) pop from the front (oldest freed first) and O(1) removal by id.
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.tables: dict[int, list[int]] = {}

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, seq_id: int) -> list[int]:
        return self.tables.get(seq_id, [])

    def num_new_blocks_needed(self, seq_id: int, total_tokens: int) -> int:
        """Blocks to add so that `seq_id` has slots for `total_tokens` tokens."""
        return max(0, self.blocks_for_tokens(total_tokens) - len(self.table(seq_id)))

    def can_grow(self, seq_id: int, total_tokens: int) -> bool:
        return self.num_new_blocks_needed(seq_id, total_tokens) <= len(self._free)

    def slot(self, seq_id: int, position: int) -> int:
        table = self.tables[seq_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size

    # ---- mutations -----------------------------------------------------------------------
    def grow(self, seq_id: int, total_tokens: int) -> list[int]:
        """Append blocks until `seq_id` has room for `total_tokens`; returns the new block ids."""
        needed = self.num_new_blocks_needed(seq_id, total_tokens)
        if needed > len(self._free):
            raise NoFreeBlocksError(
                f"sequence {seq_id} needs {needed} blocks, only {len(self._free)} free"
            )
        table = self.tables.setdefault(seq_id, [])
        new_ids = []
        for _ in range(needed):
            block_id, _ = self._free.popitem(last=False)
            self.blocks[block_id].ref_count = 1
            table.append(block_id)
            new_ids.append(block_id)
        return new_ids

    def free(self, seq_id: int) -> list[int]:
        """Drop the sequence's table; blocks whose ref count hits zero return to the free list."""
        table = self.tables.pop(seq_id, [])
        released = []
        # Tail blocks first, so a later prefix cache evicts a sequence's end before its start.
        for block_id in reversed(table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
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
        for block in self.blocks:
            in_free = block.block_id in self._free
            assert block.ref_count == refs[block.block_id], (
                f"block {block.block_id}: ref_count {block.ref_count} but "
                f"{refs[block.block_id]} table references"
            )
            assert in_free == (block.ref_count == 0), (
                f"block {block.block_id}: ref_count {block.ref_count}, in free list {in_free}"
            )
        assert len(self._free) + sum(r > 0 for r in refs) == self.num_blocks
