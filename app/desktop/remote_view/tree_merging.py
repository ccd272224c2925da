"""TreeMerger: the remote view's prefix tree, merged from the replicas' caches off the GUI thread.

Which caches the tree shows is keyed on their versions; a merge runs in a one-thread pool, at
most one at a time and, while the caches keep changing, at most once a TREE_MIN_S or three times
the last merge's cost; its answer comes back to the GUI thread by a queued signal. The view owns
one, hands it every new set of snapshots, and draws what `merged` carries (`tree_caption` words
it).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from html import escape

from PySide6.QtCore import QObject, Signal

from kvscope.app.desktop.remote_view.merged_tree import TreeRun, count_runs, merge_trees

TREE_MIN_S = 1.0  # the tree is redrawn at most this often while the caches keep changing


def _merge_timed(caches: list) -> tuple[list[TreeRun], float]:
    started = time.monotonic()
    roots = merge_trees(caches)
    return roots, time.monotonic() - started


def _key_of(snapshots: list) -> tuple:
    return tuple((s.connection.label, s.cache.version, s.cache.clears) for s in snapshots)


class TreeMerger(QObject):
    merged = Signal(object, object)  # the merged roots, the caches they came from (GUI thread)
    _answer = Signal(object)  # (tree key, caches, (roots, seconds)) from the pool's thread

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._key: tuple | None = None  # what the last merge shows
        self._latest: tuple | None = None  # what the newest snapshots hold
        self._busy = False
        self._started = -1e18
        self._cost = 0.0
        self._closed = False
        self._snapshots: list = []
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvscope-tree")
        self._answer.connect(self._on_answer)

    def settled(self) -> bool:
        """Whether the tree shows the latest snapshots' caches."""
        return self._key == self._latest and not self._busy

    def update(self, snapshots: list) -> None:
        """Merge these snapshots' caches unless the tree shows them already or a merge is too
        soon (a busy merge is followed by a fresh one when it answers)."""
        self._snapshots = snapshots
        key = self._latest = _key_of(snapshots)
        if key == self._key or self._busy or self._closed:
            return
        same_replicas = self._key is not None and [k[0] for k in key] == [k[0] for k in self._key]
        wait = max(TREE_MIN_S, 3 * self._cost)
        if same_replicas and time.monotonic() - self._started < wait:
            return
        self._busy = True
        self._started = time.monotonic()
        caches = [s.cache for s in snapshots]  # copies: no one writes them any more
        future = self._pool.submit(_merge_timed, caches)
        future.add_done_callback(lambda f: self._merged_ready(key, caches, f))

    def close(self) -> None:
        """No more merges; one running is abandoned."""
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _merged_ready(self, key: tuple, caches: list, future) -> None:
        """On the pool's thread: hand the merged tree to the GUI thread (queued signal)."""
        if future.cancelled():
            return
        try:
            self._answer.emit((key, caches, future.result()))
        except RuntimeError:  # the view was deleted meanwhile
            pass

    def _on_answer(self, answer: tuple) -> None:
        key, caches, (roots, cost) = answer
        self._busy, self._cost, self._key = False, cost, key
        self.merged.emit(roots, caches)
        self.update(self._snapshots)  # the caches may have moved on while this one was merged


def tree_caption(roots: list[TreeRun], caches: list, color_of, rows_left_out: int) -> str:
    """The caption over the tree: distinct blocks and branches, who holds how many."""
    merged = sum(r.subtree_blocks for r in roots)
    held = " · ".join(
        f"<span style='color:{color_of(c.replica)}'>■</span> {escape(c.replica)} {c.num_blocks:,}"
        for c in caches
    )
    groups = sorted({g for c in caches for g in c.groups()})
    text = (
        f"<b>Prefix tree</b> · {merged:,} distinct blocks in {count_runs(roots):,}"
        f" branches · held: {held or 'none'}"
    )
    if any(g != 0 for g in groups):
        text += f" · <span style='color:#8C94A3'>KV group 0 shown ({len(groups)} groups)</span>"
    if rows_left_out:
        text += f" · {rows_left_out:,} branches not drawn"
    return text
