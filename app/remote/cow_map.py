"""A dict whose snapshot costs O(shards), not O(entries): the remote cache's block maps.

The GUI takes a snapshot of every replica's cache four times a second, under the lock the
subscriber thread applies batches under. Copying a 200,000-entry dict takes 15-70 ms there,
all of it holding that lock (and the GIL). So the map is split, once it is big, into SHARDS
plain dicts by key hash; `frozen()` hands out the list of shards and marks each one shared,
and the writer copies a shard the first time it changes it after a snapshot. Keys hash at
random, so the first slice of writes after a snapshot (256 blocks) touches ~256 shards:
with 256 shards that copied the whole map in one lock hold; with 4,096 it copies 256/4,096
of it (~12,000 entries at 200,000 blocks, ~1 ms). Split, a map costs ~0.75 MB more. A small
map stays one dict: copying a few thousand entries is cheaper than the bookkeeping, and it
keeps insertion order.

Iteration order is insertion order while the map is one dict, shard by shard after the split."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from typing import Any

SHARDS = 4096  # a power of two: the shard is hash(key) & (SHARDS - 1)
SPLIT_AT = 8192  # entries at which one dict becomes SHARDS of them


class CowMap:
    """key -> value with dict's reading methods; writes through `set` and `pop`."""

    __slots__ = ("_shards", "_owned", "_mask", "_len")

    def __init__(self) -> None:
        self._shards: list[dict] = [{}]
        self._owned = bytearray(b"\x01")  # per shard: 1 when this map alone holds it
        self._mask = 0
        self._len = 0

    # ---- reading ---------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    def __contains__(self, key: Any) -> bool:
        return key in self._shards[hash(key) & self._mask]

    def __getitem__(self, key: Any) -> Any:
        return self._shards[hash(key) & self._mask][key]

    def get(self, key: Any, default: Any = None) -> Any:
        return self._shards[hash(key) & self._mask].get(key, default)

    def __iter__(self) -> Iterator:
        return chain.from_iterable(self._shards)

    def keys(self) -> Iterator:
        return iter(self)

    def values(self) -> Iterator:
        return chain.from_iterable(s.values() for s in self._shards)

    def items(self) -> Iterator:
        return chain.from_iterable(s.items() for s in self._shards)

    # ---- writing ---------------------------------------------------------------------
    def _writable(self, key: Any) -> dict:
        i = hash(key) & self._mask
        if not self._owned[i]:  # shared with a snapshot: this writer gets its own copy
            self._shards[i] = self._shards[i].copy()
            self._owned[i] = 1
        return self._shards[i]

    def set(self, key: Any, value: Any) -> None:
        i = hash(key) & self._mask
        shard = self._shards[i]
        if not self._owned[i]:  # _writable, inlined: this is the hot path
            shard = self._shards[i] = shard.copy()
            self._owned[i] = 1
        before = len(shard)
        shard[key] = value
        if len(shard) != before:
            self._len += 1
            if self._mask == 0 and self._len > SPLIT_AT:
                self._split()

    def pop(self, key: Any, default: Any = None) -> Any:
        shard = self._shards[hash(key) & self._mask]
        if key not in shard:
            return default
        self._len -= 1
        return self._writable(key).pop(key)

    def clear(self) -> None:
        """Fresh shards; a snapshot keeps the old ones."""
        self._shards, self._owned, self._mask, self._len = [{}], bytearray(b"\x01"), 0, 0

    def _split(self) -> None:
        shards: list[dict] = [{} for _ in range(SHARDS)]
        mask = SHARDS - 1
        for key, value in self._shards[0].items():
            shards[hash(key) & mask][key] = value
        self._shards, self._owned, self._mask = shards, bytearray(b"\x01" * SHARDS), mask

    # ---- snapshots -------------------------------------------------------------------
    def frozen(self) -> CowMap:
        """A copy that never changes, in O(shards): both sides share every shard until the
        writer changes one (then it copies that shard alone)."""
        other = CowMap.__new__(CowMap)
        other._shards = self._shards.copy()
        other._mask, other._len = self._mask, self._len
        other._owned = bytearray(len(self._shards))
        self._owned = bytearray(len(self._shards))
        return other
