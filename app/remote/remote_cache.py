"""What one remote replica's KV cache holds, rebuilt from its KV events.

Known remotely: each cached block's hash, its parent's hash (so prefix chains and the tree
they form), the token ids it holds (vLLM sends them), its block size and KV group, and when we
saw it stored. Not known: where it sits in the server's pool (physical block ids), its
reference count (how many running requests share it), or anything the server evicted while
we were not listening and could not replay.

Only the primary tier is followed: events for another `medium` (vLLM's "CPU" offload tier)
are counted in `other_medium_events` and otherwise ignored, so an offload does not look like
a GPU block appearing or vanishing."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import dataclass, field

from kvscope.app.remote.cached_block import (
    BlockMap,
    CachedBlock,
    RawBlock,
    Tokens,
    num_tokens,
    pack_tokens,
)
from kvscope.app.remote.cow_map import CowMap
from kvscope.app.remote.kv_wire import (
    PRIMARY_MEDIA,
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    EventBatch,
)
from kvscope.app.remote.leaf_order import LeafOrder

HISTORY_MAX = 4000  # points of (time, blocks held); older ones are dropped in chunks
HISTORY_STEP_S = 0.25  # batches closer than this share a point (vLLM publishes every step)

# Blocks kept per replica. A server holds at most its pool (vLLM's num_gpu_blocks, all KV
# groups together); twice that leaves room for removals we missed. Unknown pool: a fixed cap.
# A block costs ~0.5 KB here (tests/app/desktop/remote_view/test_remote_cache_bounds.py measures
# it).
DEFAULT_MAX_BLOCKS = 200_000
POOL_FACTOR = 2
MIN_MAX_BLOCKS = 4096  # a tiny pool (a test server's) still shows a few thousand
MAX_MAX_BLOCKS = 500_000  # whatever a replica says its pool is
SLICE_BLOCKS = 256  # blocks stored, removed or evicted per step of `applying`: ~2 ms


def block_cap(num_gpu_blocks: int | None) -> int:
    """The cap for a replica whose pool is `num_gpu_blocks` blocks (None: not known)."""
    if num_gpu_blocks is None or num_gpu_blocks <= 0:
        return DEFAULT_MAX_BLOCKS
    return max(MIN_MAX_BLOCKS, min(MAX_MAX_BLOCKS, POOL_FACTOR * num_gpu_blocks))


PAST_LIMIT_S = 86_400.0  # a batch's ts older than this (or ahead of us) is not trusted
FUTURE_LIMIT_S = 5.0


def event_time(ts: float, now: float) -> float:
    """The server's timestamp when it is believable, else our receipt time (a skewed clock)."""
    return ts if now - PAST_LIMIT_S <= ts <= now + FUTURE_LIMIT_S else now


@dataclass(slots=True)
class PrefixNode:
    block: CachedBlock
    children: list[PrefixNode] = field(default_factory=list)
    subtree_blocks: int = 1
    depth: int = 0
    orphan: bool = False  # parent hash not held here (stored before we listened, or evicted)


class RemoteCache:
    def __init__(self, replica: str, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be at least 1, got {max_blocks}")
        self.replica = replica
        self._blocks = CowMap()  # (group, hash) -> RawBlock; copy() is O(shards)
        # (group, parent hash, packed tokens) -> hash: the token-id fallback of routing.
        self._by_content = CowMap()
        self._order: LeafOrder | None = LeafOrder()  # who goes first over the cap; None: a copy
        self._group_sizes: dict[int, int] = {}
        self.clears = 0
        self.history: list[tuple[float, int]] = []
        self.stored_total = 0
        self.removed_total = 0
        self.unknown_removals = 0  # removals of blocks we never saw stored (a gap, or joined late)
        self.other_medium_events = 0
        self.max_blocks = max_blocks
        self.not_kept = 0  # blocks evicted here because the cache was at max_blocks
        self.block_size: int | None = None  # the latest BlockStored's
        self.version = 0  # bumps on every change, so snapshots can skip unchanged copies

    @property
    def blocks(self) -> BlockMap:
        """(group, hash) -> CachedBlock, read-only."""
        return BlockMap(self._blocks)

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    def apply(self, batch: EventBatch, now: float) -> None:
        """`now`: our clock at receipt. The batch's own `ts` (the server's clock) dates it
        instead when plausible, so history replayed on connecting lands where it happened."""
        for _ in self.applying(batch, now):
            pass

    def applying(self, batch: EventBatch, now: float) -> Iterator[None]:
        """`apply`, a slice at a time: each step stores, removes or evicts at most SLICE_BLOCKS
        blocks and leaves the cache whole (version bumped), so the caller can let go of its
        lock between steps; a reader then sees part of the batch, consistently applied."""
        self._writable()
        now = event_time(batch.ts, now)
        left = SLICE_BLOCKS
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                self.clear()
            elif event.medium not in PRIMARY_MEDIA:
                self.other_medium_events += 1
            elif isinstance(event, BlockStored):
                bs = event.block_size
                self.block_size = bs
                parent = event.parent_block_hash
                tokens = event.token_ids
                for i, h in enumerate(event.block_hashes):
                    packed = pack_tokens(tokens[i * bs : (i + 1) * bs])
                    left -= self._store(event.group_idx, h, parent, packed, bs, now)
                    parent = h
                    if left <= 0:
                        self.version += 1
                        yield
                        left = SLICE_BLOCKS
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    self._remove((event.group_idx, h))
                    left -= 1
                    if left <= 0:
                        self.version += 1
                        yield
                        left = SLICE_BLOCKS
        self.version += 1
        self._record(now)

    def trimming(self) -> Iterator[None]:
        """Evicts down to `max_blocks` (after it was lowered), SLICE_BLOCKS a step."""
        self._writable()
        while len(self._blocks) > self.max_blocks:
            for _ in range(min(SLICE_BLOCKS, len(self._blocks) - self.max_blocks)):
                self._evict()
            self.version += 1
            yield

    def _writable(self) -> None:
        """A copy written to (the view's tests do) gets an eviction order of its own, oldest
        stored first: copies leave it out, as they are made four times a second."""
        if self._order is not None:
            return
        self._order = LeafOrder()
        for raw in sorted(self._blocks.values(), key=lambda raw: raw[5]):
            h, parent, _, _, group, _ = raw
            self._order.added((group, h), None if parent is None else (group, parent))

    @property
    def _written_order(self) -> LeafOrder:
        # Only the writers below reach this, and each runs after _writable() gave a copy its own.
        assert self._order is not None
        return self._order

    def clear(self) -> None:
        """The server dropped everything (AllBlocksCleared: a reset, or a restart)."""
        self._blocks.clear()
        self._by_content.clear()
        if self._order is not None:
            self._order.clear()
        self._group_sizes.clear()
        self.clears += 1
        self.version += 1

    def _store(
        self, group: int, h: BlockHash, parent: BlockHash | None, tokens: Tokens, bs: int, now
    ) -> int:
        """Holds one block; returns the work done (2 when it cost an eviction)."""
        key = (group, h)
        old = self._blocks.get(key)
        if old is not None:
            self._unlink(key, old)
        else:
            self._group_sizes[group] = self._group_sizes.get(group, 0) + 1
        self._blocks.set(key, (h, parent, tokens, bs, group, now))
        if num_tokens(tokens) == bs:
            self._by_content.set((group, parent, tokens), h)
        self._written_order.added(key, None if parent is None else (group, parent))
        self.stored_total += 1
        if len(self._blocks) <= self.max_blocks:
            return 1
        self._evict()
        return 2

    def _remove(self, key: tuple[int, BlockHash]) -> None:
        if key not in self._blocks:
            self.unknown_removals += 1
            return
        self._drop(key)
        self.removed_total += 1

    def _evict(self) -> None:
        self._drop(self._written_order.next_out())
        self.not_kept += 1

    def _drop(self, key: tuple[int, BlockHash]) -> None:
        self._unlink(key, self._blocks.pop(key))
        self._written_order.discard(key)
        group = key[0]
        left = self._group_sizes[group] - 1
        if left:
            self._group_sizes[group] = left
        else:
            del self._group_sizes[group]

    def _unlink(self, key: tuple[int, BlockHash], raw: RawBlock) -> None:
        """The block `raw`, held under `key`, no longer is: out of the content index and its
        parent's count of children."""
        h, parent, tokens, _, group, _ = raw
        content = (group, parent, tokens)
        if self._by_content.get(content) == h:
            self._by_content.pop(content)
        if parent is not None and (group, parent) != key:
            self._written_order.unlinked((group, parent))

    def _record(self, now: float) -> None:
        if self.history and 0 <= now - self.history[-1][0] < HISTORY_STEP_S:
            self.history[-1] = (self.history[-1][0], len(self._blocks))
            return
        self.history.append((now, len(self._blocks)))
        if len(self.history) > HISTORY_MAX:
            del self.history[: HISTORY_MAX // 4]

    # ---- reading ------------------------------------------------------------------------
    def groups(self) -> list[int]:
        return sorted(self._group_sizes)

    def tree(self, group: int = 0) -> list[PrefixNode]:
        """The group's blocks as a forest of prefix chains, biggest subtree first. Built without
        recursion: a long conversation is a chain thousands of blocks deep."""
        paused = gc.isenabled()
        gc.disable()  # tens of thousands of new nodes: collections mid-build would double the time
        try:
            return self._tree(group)
        finally:
            if paused:
                gc.enable()

    def _tree(self, group: int) -> list[PrefixNode]:
        make = CachedBlock._make
        nodes = {
            raw[0]: PrefixNode(make(raw)) for (g, _), raw in self._blocks.items() if g == group
        }
        roots: list[PrefixNode] = []
        for node in nodes.values():
            parent_hash = node.block.parent_hash
            parent = nodes.get(parent_hash) if parent_hash is not None else None
            if parent is None or parent is node:
                node.orphan = parent_hash is not None
                roots.append(node)
            else:
                parent.children.append(node)
        # Depths top-down, then subtree sizes bottom-up, over one explicit pre-order walk.
        order: list[PrefixNode] = []
        stack = list(roots)
        while stack:
            node = stack.pop()
            order.append(node)
            for child in node.children:
                child.depth = node.depth + 1
                stack.append(child)
        for node in reversed(order):
            children = node.children
            if children:
                node.subtree_blocks = 1 + sum(c.subtree_blocks for c in children)
                if len(children) > 1:
                    children.sort(key=lambda c: (-c.subtree_blocks, c.block.stored_at))
        roots.sort(key=lambda r: (-r.subtree_blocks, r.block.stored_at))
        # A cycle (a broken server) leaves nodes unreached; they are dropped, not looped on.
        return roots

    def held_prefix_blocks(self, token_ids: list[int], block_size: int, group: int = 0) -> int:
        """How many leading full blocks of `token_ids` this replica holds, matched by token
        content along parent links from a root block (the token-id method of routing)."""
        parent: BlockHash | None = None
        held = 0
        for i in range(len(token_ids) // block_size):
            tokens = pack_tokens(token_ids[i * block_size : (i + 1) * block_size])
            h = self._by_content.get((group, parent, tokens))
            if h is None:
                break
            held += 1
            parent = h
        return held

    def holds(self, block_hash: BlockHash, group: int = 0) -> bool:
        return (group, block_hash) in self._blocks

    def copy(self) -> RemoteCache:
        """A read-only snapshot the GUI may read while the subscriber thread keeps applying
        events; O(shards), not O(blocks) (cow_map.py says why)."""
        other = RemoteCache.__new__(RemoteCache)
        other.__dict__.update(self.__dict__)
        other._blocks = self._blocks.frozen()
        other._by_content = self._by_content.frozen()
        other._order = None  # the writer's alone; made anew if the copy is written to
        other._group_sizes = self._group_sizes.copy()
        other.history = self.history.copy()
        return other
