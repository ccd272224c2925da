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
from dataclasses import dataclass, field

from app.remote.kv_wire import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, EventBatch

PRIMARY_MEDIA = (None, "GPU")
HISTORY_MAX = 4000  # points of (time, blocks held); older ones are dropped in chunks
HISTORY_STEP_S = 0.25  # batches closer than this share a point (vLLM publishes every step)


PAST_LIMIT_S = 86_400.0  # a batch's ts older than this (or ahead of us) is not trusted
FUTURE_LIMIT_S = 5.0


def event_time(ts: float, now: float) -> float:
    """The server's timestamp when it is believable, else our receipt time (a skewed clock)."""
    return ts if now - PAST_LIMIT_S <= ts <= now + FUTURE_LIMIT_S else now


@dataclass(frozen=True, slots=True)
class CachedBlock:
    hash: BlockHash
    parent_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    group: int
    stored_at: float

    @property
    def full(self) -> bool:
        """The event carried this block's tokens (vLLM always does; we do not assume it)."""
        return len(self.token_ids) == self.block_size


@dataclass(slots=True)
class PrefixNode:
    block: CachedBlock
    children: list[PrefixNode] = field(default_factory=list)
    subtree_blocks: int = 1
    depth: int = 0
    orphan: bool = False  # parent hash not held here (stored before we listened, or evicted)


class RemoteCache:
    def __init__(self, replica: str) -> None:
        self.replica = replica
        self.blocks: dict[tuple[int, BlockHash], CachedBlock] = {}
        # (group, parent hash, token ids) -> hash: the token-id fallback of routing.
        self._by_content: dict[tuple[int, BlockHash | None, tuple[int, ...]], BlockHash] = {}
        self.clears = 0
        self.history: list[tuple[float, int]] = []
        self.stored_total = 0
        self.removed_total = 0
        self.unknown_removals = 0  # removals of blocks we never saw stored (a gap, or joined late)
        self.other_medium_events = 0
        self.block_size: int | None = None  # the latest BlockStored's
        self.version = 0  # bumps on every change, so snapshots can skip unchanged copies

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def apply(self, batch: EventBatch, now: float) -> None:
        """`now`: our clock at receipt. The batch's own `ts` (the server's clock) dates it
        instead when plausible, so history replayed on connecting lands where it happened."""
        now = event_time(batch.ts, now)
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                self.clear()
            elif event.medium not in PRIMARY_MEDIA:
                self.other_medium_events += 1
            elif isinstance(event, BlockStored):
                self._store(event, now)
            elif isinstance(event, BlockRemoved):
                self._remove(event)
        self.version += 1
        self._record(now)

    def clear(self) -> None:
        """The server dropped everything (AllBlocksCleared: a reset, or a restart)."""
        self.blocks.clear()
        self._by_content.clear()
        self.clears += 1
        self.version += 1

    def _store(self, event: BlockStored, now: float) -> None:
        bs = event.block_size
        self.block_size = bs
        parent = event.parent_block_hash
        group = event.group_idx
        for i, h in enumerate(event.block_hashes):
            tokens = tuple(event.token_ids[i * bs : (i + 1) * bs])
            old = self.blocks.get((group, h))
            if old is not None:
                self._by_content.pop((group, old.parent_hash, old.token_ids), None)
            block = CachedBlock(h, parent, tokens, bs, group, now)
            self.blocks[(group, h)] = block
            if block.full:
                self._by_content[(group, parent, tokens)] = h
            self.stored_total += 1
            parent = h

    def _remove(self, event: BlockRemoved) -> None:
        for h in event.block_hashes:
            block = self.blocks.pop((event.group_idx, h), None)
            if block is None:
                self.unknown_removals += 1
                continue
            key = (block.group, block.parent_hash, block.token_ids)
            if self._by_content.get(key) == h:
                del self._by_content[key]
            self.removed_total += 1

    def _record(self, now: float) -> None:
        if self.history and 0 <= now - self.history[-1][0] < HISTORY_STEP_S:
            self.history[-1] = (self.history[-1][0], len(self.blocks))
            return
        self.history.append((now, len(self.blocks)))
        if len(self.history) > HISTORY_MAX:
            del self.history[: HISTORY_MAX // 4]

    # ---- reading ------------------------------------------------------------------------
    def groups(self) -> list[int]:
        return sorted({group for group, _ in self.blocks})

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
        nodes = {b.hash: PrefixNode(b) for (g, _), b in self.blocks.items() if g == group}
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
            tokens = tuple(token_ids[i * block_size : (i + 1) * block_size])
            h = self._by_content.get((group, parent, tokens))
            if h is None:
                break
            held += 1
            parent = h
        return held

    def holds(self, block_hash: BlockHash, group: int = 0) -> bool:
        return (group, block_hash) in self.blocks

    def copy(self) -> RemoteCache:
        """A snapshot the GUI may read while the subscriber thread keeps applying events."""
        other = RemoteCache.__new__(RemoteCache)
        other.__dict__.update(self.__dict__)
        other.blocks = self.blocks.copy()  # dict.copy: ~5x faster than dict(...)
        other._by_content = self._by_content.copy()
        other.history = self.history.copy()
        return other
