"""One remote cached block, and how the remote cache holds hundreds of thousands of them.

Kept small and out of the garbage collector's way, because a replica's cache reaches its cap
(remote_cache.block_cap) under a flood:
- token ids packed 4 bytes each (`pack_tokens`): a tuple of ints costs ~36 bytes a token;
- a block held as a plain tuple of plain values, which CPython's collector stops tracking
  after its first collection (it does so for exact tuples only, not for a NamedTuple or a
  slotted instance). Tracked, 200,000 blocks made every full collection take ~140 ms, run on
  whichever thread allocates, the GUI's included. Readers get a `CachedBlock` (a NamedTuple
  over the same values) made as they read, through `BlockMap`."""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from kvscope.app.remote.cow_map import CowMap
from kvscope.app.remote.kv_wire import BlockHash

Tokens = bytes | tuple[int, ...]
RawBlock = tuple  # CachedBlock's fields, in its order, as a plain tuple


def pack_tokens(token_ids: Sequence[int]) -> Tokens:
    """Token ids 4 bytes each; a tuple when one does not fit in 32 bits (a peer's odd value,
    kept as sent). Equal ids pack equal, so packed tokens serve as keys."""
    try:
        return array("I", token_ids).tobytes()
    except OverflowError:
        return tuple(token_ids)


def num_tokens(tokens: Tokens) -> int:
    return len(tokens) // 4 if isinstance(tokens, bytes) else len(tokens)


class CachedBlock(NamedTuple):
    hash: BlockHash
    parent_hash: BlockHash | None
    tokens: Tokens  # pack_tokens' form; token_ids reads it back
    block_size: int
    group: int
    stored_at: float

    @property
    def token_ids(self) -> tuple[int, ...]:
        tokens = self.tokens
        return tuple(array("I", tokens)) if isinstance(tokens, bytes) else tokens

    @property
    def full(self) -> bool:
        """The event carried this block's tokens (vLLM always does; we do not assume it)."""
        return num_tokens(self.tokens) == self.block_size


_block = CachedBlock._make


class BlockMap:
    """(group, hash) -> CachedBlock, read-only, over a CowMap of RawBlocks."""

    __slots__ = ("_map",)

    def __init__(self, raw: CowMap) -> None:
        self._map = raw

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, key: object) -> bool:
        return key in self._map

    def __iter__(self) -> Iterator:
        return iter(self._map)

    def __getitem__(self, key: tuple[int, BlockHash]) -> CachedBlock:
        return _block(self._map[key])

    def get(self, key: tuple[int, BlockHash], default=None) -> CachedBlock | None:
        raw = self._map.get(key)
        return default if raw is None else _block(raw)

    def keys(self) -> Iterator:
        return iter(self._map)

    def values(self) -> Iterator[CachedBlock]:
        return map(_block, self._map.values())

    def items(self) -> Iterator[tuple[tuple[int, BlockHash], CachedBlock]]:
        return ((key, _block(raw)) for key, raw in self._map.items())
