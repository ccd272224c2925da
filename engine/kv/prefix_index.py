"""The prefix-cache index: which physical block holds which prefix block, per KV group.

Every full block gets a hash chained from its parent's hash and its token ids (salted with what
changes a token's K/V). A block keeps its hash while it is used and while it sits freed
("cached"), until the allocator evicts it (`drop`). Each group has its own hash map (a block
holds one group's layers). A prefix hit of n blocks (L = n * block_size tokens)
is valid when every group has what computing token L onward reads: a full group all n blocks, a
sliding group of window W the blocks from (L - W + 1) // block_size to n - 1 (vLLM's sliding-window
rule). A sliding group's block given back early is thus reused only where it is under the new
sequence's window; the blocks before that start NULL in the new table.

The allocator (engine.kv.paged) owns the blocks, their references and the free lists;
this index only names the blocks that hold a prefix, hashes token runs and answers prefix
queries. Plain data, like the allocator.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xxhash

from kvscope.engine.kv.allocator import NULL_BLOCK, PrefixMatch
from kvscope.engine.kv.block import Block
from kvscope.engine.kv.layout import KVLayout


class PrefixIndex:
    """Per group: prefix hash -> the block holding it; the blocks themselves are the allocator's."""

    def __init__(self, blocks: list[Block], layout: KVLayout, cache_salt: bytes = b"") -> None:
        self.blocks = blocks
        self.layout = layout
        self.block_size = layout.block_size
        self.num_groups = layout.num_groups
        self.windows = layout.windows
        # Anything that changes what K/V a token produces (model, KV dtype) goes into every hash.
        self.cache_salt = cache_salt
        self.maps: list[dict[int, int]] = [{} for _ in range(self.num_groups)]

    def hash_block(self, parent: int | None, token_ids: Sequence[int]) -> int:
        h = xxhash.xxh3_64(self.cache_salt)
        h.update(b"root" if parent is None else parent.to_bytes(8, "little"))
        h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
        return h.intdigest()

    def lookup(self, group: int, h: int, tokens: tuple[int, ...], parent: int | None) -> int:
        """The group's block holding exactly this prefix block, or NULL_BLOCK."""
        block_id = self.maps[group].get(h)
        if block_id is None:
            return NULL_BLOCK
        block = self.blocks[block_id]
        if block.token_ids != tokens or block.parent_hash != parent:
            return NULL_BLOCK
        return block_id

    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        """The longest cached prefix of `token_ids` that every group can resume from (see the
        module docstring for the rule).

        At most (len - 1) // block_size blocks: the last token is always computed, so the
        request has logits to sample from and never writes into a shared cached block."""
        bs = self.block_size
        hashes: list[int] = []
        found: list[list[int]] = [[] for _ in range(self.num_groups)]
        parent = None
        full = [g for g, w in enumerate(self.windows) if w is None]
        for i in range((len(token_ids) - 1) // bs):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            h = self.hash_block(parent, tokens)
            row = [self.lookup(g, h, tokens, parent) for g in range(self.num_groups)]
            if any(row[g] == NULL_BLOCK for g in full):
                break  # a full group needs every block: no longer prefix can be valid
            hashes.append(h)
            for g, block_id in enumerate(row):
                found[g].append(block_id)
            # With only sliding groups a block missing everywhere does not end the search: the
            # window of a longer prefix may lie wholly past it.
            parent = h
        n = len(hashes)
        while n > 0 and not self._resumable(found, n):
            n -= 1
        groups = []
        for g in range(self.num_groups):
            first = self.layout.first_needed_block(g, n * bs)
            groups.append([NULL_BLOCK] * first + found[g][first:n])
        return PrefixMatch(groups[0], hashes[:n], tuple(groups))

    def _resumable(self, found: list[list[int]], n: int) -> bool:
        """Every group holds what computing on from block n reads."""
        for g in range(self.num_groups):
            first = self.layout.first_needed_block(g, n * self.block_size)
            if any(b == NULL_BLOCK for b in found[g][first:n]):
                return False
        return True

    def add(
        self, group: int, block: Block, h: int, tokens: tuple[int, ...], parent: int | None
    ) -> bool:
        """Record that `block` holds the prefix block `h`; True if it now does. The first block
        to hold a prefix owns its hash; a twin computed concurrently by another sequence simply
        stays uncached."""
        if block.block_hash is not None or h in self.maps[group]:
            return False
        block.block_hash, block.token_ids, block.parent_hash = h, tokens, parent
        self.maps[group][h] = block.block_id
        return True

    def drop(self, block: Block) -> None:
        """Forget the prefix an evicted block held."""
        assert block.block_hash is not None  # only blocks with a hash are cached and evicted
        del self.maps[block.group][block.block_hash]
        block.block_hash = block.token_ids = block.parent_hash = None
