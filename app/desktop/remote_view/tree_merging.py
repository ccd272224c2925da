"""TreeMerging: the remote view's prefix tree, merged from the replicas' caches off the GUI thread.

A part of RemoteView (view.py), apart because it is one concept: which caches the tree shows
(keyed on their versions), a merge in a one-thread pool at most once a TREE_MIN_S or three
times the last merge's cost, its answer carried back by a queued signal, and the caption it
writes. It reads the view's snapshots, tree, texts, colours and the _tree_* state it sets up.
"""

from __future__ import annotations

import time
from html import escape

from PySide6.QtCore import QObject, Signal

from kvscope.app.desktop.remote_view.merged_tree import TreeRun, count_runs, merge_trees

TREE_MIN_S = 1.0  # the tree is redrawn at most this often while the caches keep changing


def _merge_timed(caches: list) -> tuple[list[TreeRun], float]:
    started = time.monotonic()
    roots = merge_trees(caches)
    return roots, time.monotonic() - started


class MergeBridge(QObject):
    """Carries a merge's answer from the pool's thread to the GUI thread (a queued signal)."""

    merged = Signal(object)  # (tree key, caches, (roots, seconds the merge took))


class TreeMerging:
    """Mixed into RemoteView, the QWidget that owns the attributes these methods read."""

    def _tree_key_of(self, snapshots: list) -> tuple:
        return tuple((s.connection.label, s.cache.version, s.cache.clears) for s in snapshots)

    def tree_settled(self) -> bool:
        """Whether the tree shows the latest snapshots' caches (it is merged in a worker)."""
        return self._tree_key == self._tree_key_of(self.snapshots) and not self._tree_busy

    def _update_tree(self) -> None:
        """Merge the caches in a worker thread (a big cache takes a good part of a second),
        at most one merge at a time and, while the caches keep changing, no more often than
        every TREE_MIN_S or three times the last merge's cost."""
        key = self._tree_key_of(self.snapshots)
        if key == self._tree_key or self._tree_busy or self._closed:
            return  # a busy merge is followed by a fresh one at a later tick
        same_replicas = self._tree_key is not None and [k[0] for k in key] == [
            k[0] for k in self._tree_key
        ]
        wait = max(TREE_MIN_S, 3 * self._tree_cost)
        if same_replicas and time.monotonic() - self._tree_started < wait:
            return
        self._tree_busy = True
        self._tree_started = time.monotonic()
        caches = [s.cache for s in self.snapshots]  # copies: no one writes them any more
        future = self._tree_pool.submit(_merge_timed, caches)
        future.add_done_callback(lambda f: self._merged_ready(key, caches, f))

    def _merged_ready(self, key: tuple, caches: list, future) -> None:
        """On the worker thread: hand the merged tree to the GUI thread (queued signal)."""
        if future.cancelled():
            return
        try:
            self._bridge.merged.emit((key, caches, future.result()))
        except RuntimeError:  # the view was deleted meanwhile
            pass

    def _on_merged(self, answer: tuple) -> None:
        key, caches, (roots, cost) = answer
        self._tree_busy = False
        self._tree_cost = cost
        self._tree_key = key
        self.roots = roots
        self.tree.set_roots(roots)
        self.texts.decode_previews()
        merged = sum(r.subtree_blocks for r in roots)
        held = " · ".join(
            f"<span style='color:{self.colors.color(c.replica)}'>■</span> {escape(c.replica)}"
            f" {c.num_blocks:,}"
            for c in caches
        )
        groups = sorted({g for c in caches for g in c.groups()})
        text = (
            f"<b>Prefix tree</b> · {merged:,} distinct blocks in {count_runs(roots):,}"
            f" branches · held: {held or 'none'}"
        )
        if any(g != 0 for g in groups):
            text += f" · <span style='color:#8C94A3'>KV group 0 shown ({len(groups)} groups)</span>"
        if self.tree.rows_left_out:
            text += f" · {self.tree.rows_left_out:,} branches not drawn"
        self.tree_caption.setText(text)
        self._update_tree()  # the caches may have moved on while this one was merged
