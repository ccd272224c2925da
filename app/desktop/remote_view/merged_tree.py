"""All replicas' prefix trees merged into one by token content, with single-child chains
collapsed into runs (what the tree widget draws).

Two replicas hash the same prompt differently when their hash seeds differ (vLLM salts
sha256 with PYTHONHASHSEED), so blocks are matched by what they hold: the same token ids under
the same merged parent are one merged block, held by every replica that stored it. A block
whose event carried no token ids can only be matched by hash, so it stays its replica's own.
Orphans (parent not held) start their own roots and never merge with a true prompt start:
their tokens come from the middle of a prompt.

A run is a chain of merged blocks, each the only child of the one before, all held by the
same replicas: a 100-block system prompt cached on one replica is one run of 100 blocks; where
a second replica's copy ends, the run splits, so each run has one set of colours."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvscope.app.remote.remote_cache import PrefixNode, RemoteCache


@dataclass
class _Merged:
    key: tuple  # its content key among its siblings
    tokens: tuple[int, ...]
    replicas: dict[str, None] = field(default_factory=dict)  # an ordered set
    children: dict[tuple, _Merged] = field(default_factory=dict)
    orphan: bool = False


@dataclass
class TreeRun:
    key: tuple  # stable path of content keys: keeps expansion and selection across redraws
    token_ids: tuple[int, ...]  # every token of the run's blocks, in order
    blocks: int  # blocks in this run
    replicas: tuple[str, ...]  # replicas holding every block of the run
    depth_blocks: int  # blocks before this run on its path (its first block's position)
    orphan: bool = False
    children: list[TreeRun] = field(default_factory=list)
    subtree_blocks: int = 0  # merged blocks in this run and below
    held: dict[str, int] = field(default_factory=dict)  # per replica: its blocks in the subtree


def _content_key(replica: str, node: PrefixNode) -> tuple:
    block = node.block
    if block.token_ids:
        return ("orphan" if node.orphan else "tokens", block.token_ids)
    return ("hash", replica, block.hash)


def merge_trees(caches: Iterable[RemoteCache], group: int = 0) -> list[TreeRun]:
    """The merged, collapsed forest of every cache's group `group`, biggest subtree first."""
    top = _Merged((), ())
    for cache in caches:
        replica = cache.replica
        stack = [(top, root) for root in cache.tree(group)]
        while stack:  # no recursion: chains run thousands of blocks deep
            parent, node = stack.pop()
            key = _content_key(replica, node)
            merged = parent.children.get(key)
            if merged is None:
                merged = _Merged(key, node.block.token_ids, orphan=node.orphan)
                parent.children[key] = merged
            merged.replicas[replica] = None
            stack.extend((merged, child) for child in node.children)
    return _collapse(top)


def _collapse(top: _Merged) -> list[TreeRun]:
    roots: list[TreeRun] = []
    # (merged node starting a run, list to append the run to, parent path key, depth)
    stack: list[tuple[_Merged, list[TreeRun], tuple, int]]
    stack = [(m, roots, (), 0) for m in top.children.values()]
    runs: list[TreeRun] = []  # in creation (pre-) order, for the bottom-up sums below
    while stack:
        start, siblings, parent_key, depth = stack.pop()
        replicas = tuple(start.replicas)
        tokens = list(start.tokens)
        blocks, node = 1, start
        while len(node.children) == 1:
            (child,) = node.children.values()
            if set(child.replicas) != set(replicas):
                break
            node = child
            tokens.extend(node.tokens)
            blocks += 1
        key = (*parent_key, start.key)
        run = TreeRun(key, tuple(tokens), blocks, replicas, depth, start.orphan)
        siblings.append(run)
        runs.append(run)
        stack.extend((c, run.children, key, depth + blocks) for c in node.children.values())
    for run in reversed(runs):
        run.subtree_blocks = run.blocks + sum(c.subtree_blocks for c in run.children)
        held = dict.fromkeys(run.replicas, run.blocks)
        for below in run.children:
            for replica, n in below.held.items():
                held[replica] = held.get(replica, 0) + n
        run.held = held
        run.children.sort(key=lambda r: -r.subtree_blocks)
    roots.sort(key=lambda r: -r.subtree_blocks)
    return roots


def count_runs(roots: list[TreeRun]) -> int:
    n, stack = 0, list(roots)
    while stack:
        run = stack.pop()
        n += 1
        stack.extend(run.children)
    return n
