"""Which cached block goes first when a replica's cache is over its cap: the oldest leaf.

Why leaves, oldest first: it is what the server itself does. vLLM frees a finished request's
blocks tail first, and its free queue evicts the least recently freed first, so a chain
shrinks from its end and a prefix that others extend (a shared system prompt) stays while
anything under it is held. Evicting the oldest block regardless would drop exactly those
roots first and turn every conversation under them into an orphan; refusing new blocks
would freeze the view on old history, while the newest blocks are the ones the server
surely still holds (and the ones routing asks about). A parent whose last child goes is
next in line: its chain is the one being cut.

Blocks in a cycle (a broken or hostile server: A's parent is B, B's is A) are never leaves;
when only such blocks are left, one of them goes, so the cap holds whatever the links say.
Child counts are a guide, not a proof: a child announced before its parent is not counted,
which can only make the parent look like a leaf earlier.

No big dict: one dict of 175,000 keys takes 16 ms (an OrderedDict 26 ms) to resize, and under
churn a dict resizes every ~n/2 inserts to compact itself. Leaves sit in epochs of EPOCH
insertions (oldest epoch first, each an OrderedDict), found through a sharded map (CowMap)."""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any

from kvscope.app.remote.cow_map import CowMap

EPOCH = 4096  # leaves per epoch: small OrderedDicts, cheap to resize


class LeafOrder:
    __slots__ = ("_epochs", "_where", "_kids", "_fill")

    def __init__(self) -> None:
        self._epochs: deque[OrderedDict[Any, None]] = deque([OrderedDict()])
        self._where = CowMap()  # a held leaf -> its epoch
        self._kids = CowMap()  # a held key with counted children -> how many
        self._fill = 0  # leaves appended to the newest epoch

    def __len__(self) -> int:
        return len(self._where) + len(self._kids)

    def added(self, key: Any, parent: Any | None) -> None:
        """`key` is held now (again, if it was: its children stay counted), under `parent`
        (a key held here, or None)."""
        if key not in self._kids:
            self._unleaf(key)  # stored again: the newest leaf
            self._leaf(key)
        if parent is None or parent == key:
            return
        if self._unleaf(parent):
            self._kids.set(parent, 1)
        else:
            count = self._kids.get(parent)
            if count is not None:
                self._kids.set(parent, count + 1)

    def unlinked(self, parent: Any | None) -> None:
        """A child of `parent` went (removed, evicted, or re-stored under another parent)."""
        count = self._kids.get(parent)
        if count is None:
            return
        if count > 1:
            self._kids.set(parent, count - 1)
            return
        self._kids.pop(parent)
        self._leaf(parent, front=True)  # next in line: its chain is being cut

    def discard(self, key: Any) -> None:
        """`key` is no longer held (its own parent's count is `unlinked`'s business)."""
        if not self._unleaf(key):
            self._kids.pop(key)

    def next_out(self) -> Any:
        """The key to evict (still held until the caller discards it); raises StopIteration
        when nothing is held."""
        epochs = self._epochs
        while len(epochs) > 1 and not epochs[0]:
            epochs.popleft()
        if epochs[0]:
            return next(iter(epochs[0]))
        return next(iter(self._kids))  # only cycles left: any one of them will do

    def clear(self) -> None:
        self._epochs = deque([OrderedDict()])
        self._where, self._kids, self._fill = CowMap(), CowMap(), 0

    def _leaf(self, key: Any, front: bool = False) -> None:
        if front:
            epoch = self._epochs[0]
            epoch[key] = None
            epoch.move_to_end(key, last=False)
        else:
            if self._fill >= EPOCH:
                self._epochs.append(OrderedDict())
                self._fill = 0
            epoch = self._epochs[-1]
            epoch[key] = None
            self._fill += 1
        self._where.set(key, epoch)

    def _unleaf(self, key: Any) -> bool:
        epoch = self._where.pop(key)
        if epoch is None:
            return False
        del epoch[key]
        return True
