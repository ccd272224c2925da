"""Reproduce a server's prefix-cache block hashes, so routing can ask "does replica R hold
block h of this prompt?" with the very keys R's KV events carry.

vLLM (read at vllm-project/vllm @ 001cabc1be16a59a70d720ed61a13b678c060a18,
vllm/v1/core/kv_cache_utils.py, and @ ac621345a4eb18058bb24b242b457f634d476b40,
vllm/utils/hashing.py; the algorithm names are CacheConfig.prefix_caching_hash_algo):

- block i of a prompt (full blocks only, `block_size` tokens each) hashes
  `hash_fn((parent, tuple(tokens_i), extra_keys))`, `parent` being block i-1's hash, or for
  the first block NONE_HASH; `extra_keys` is None unless the request has a LoRA adapter, a
  cache_salt, multimodal inputs or prompt embeddings (those we cannot reproduce: such blocks
  simply do not match);
- NONE_HASH = `hash_fn(os.getenv("PYTHONHASHSEED"))` (the seed as a str); with the variable
  unset it is 32 random bytes, and no one outside the server can reproduce its hashes;
- hash_fn by algorithm: "sha256" (vLLM's default): SHA-256 of `pickle.dumps(x,
  protocol=pickle.HIGHEST_PROTOCOL)`; "sha256_cbor": SHA-256 of `cbor2.dumps(x,
  canonical=True)` (both as in hashing.py @ ac621345); "xxhash" / "xxhash_cbor": the xxh3-128
  digest (`xxhash.xxh3_128_digest`) of the same serialisations, as later hashing.py versions
  define them (kv_cache_utils @ 001cabc1 imports xxhash_cbor; that hashing.py is not the
  one read at ac621345, which predates it);
- the KV events carry `int.from_bytes(digest, "big") & (2**64 - 1)` (the low 64 bits) when
  VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default, else the digest bytes; the chain itself
  always runs on the full digests.

Pickle-based hashes depend on the pickle format (stable for bytes, tuples of ints and None at
protocol 5, but vLLM warns they may differ across Python versions); the CBOR ones are meant to
be reproducible. Newer vLLM adds msgpack-based algorithms, not reproduced here.

KVScope's own engine (engine/kv/block_manager.py `hash_block`) hashes
xxh3_64(salt, parent's 8 bytes or b"root", int64 token ids), with a salt made from the model's
path and KV dtype that `kvscope serve` does not publish: not reproducible from outside, so
routing falls back to the events' token ids (app/remote/routing.py)."""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import cbor2
import xxhash

ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
DEFAULT_ALGO = "sha256"  # vLLM's CacheConfig default
INT_MASK = (1 << 64) - 1


class UnknownHashAlgo(ValueError):
    """An algorithm name we do not reproduce."""


def _pickled(x: Any) -> bytes:
    return pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)


def _cbor(x: Any) -> bytes:
    return cbor2.dumps(x, canonical=True)


def hash_function(algo: str) -> Callable[[Any], bytes]:
    """vLLM's hash function by its `--prefix-caching-hash-algo` name."""
    if algo == "sha256":
        return lambda x: hashlib.sha256(_pickled(x)).digest()
    if algo == "sha256_cbor":
        return lambda x: hashlib.sha256(_cbor(x)).digest()
    if algo == "xxhash":
        return lambda x: xxhash.xxh3_128_digest(_pickled(x))
    if algo == "xxhash_cbor":
        return lambda x: xxhash.xxh3_128_digest(_cbor(x))
    raise UnknownHashAlgo(f"prefix-caching hash algorithm must be one of {ALGOS}, got {algo!r}")


def external_hash(digest: bytes, int_hashes: bool = True) -> int | bytes:
    """A block hash as KV events carry it (vLLM's maybe_convert_block_hash)."""
    return int.from_bytes(digest, "big") & INT_MASK if int_hashes else digest


@dataclass(frozen=True)
class BlockHasher:
    algo: str
    seed: str  # the server's PYTHONHASHSEED
    int_hashes: bool = True  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
    _fn: Callable[[Any], bytes] = field(init=False, repr=False, compare=False)
    _none_hash: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fn = hash_function(self.algo)
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_none_hash", fn(self.seed))

    @property
    def method(self) -> str:
        return f"hash ({self.algo})"

    @property
    def none_hash(self) -> bytes:
        return self._none_hash

    def hash_block(self, parent: bytes | None, token_ids: Sequence[int]) -> bytes:
        return self._fn((parent or self._none_hash, tuple(token_ids), None))

    def chain(self, token_ids: Sequence[int], block_size: int) -> list[bytes]:
        """Full digests of the prompt's full blocks, in order."""
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        digests: list[bytes] = []
        parent: bytes | None = None
        for i in range(len(token_ids) // block_size):
            parent = self.hash_block(parent, token_ids[i * block_size : (i + 1) * block_size])
            digests.append(parent)
        return digests

    def event_hashes(self, token_ids: Sequence[int], block_size: int) -> list[int | bytes]:
        """The prompt's block hashes as the server's KV events would carry them."""
        return [external_hash(d, self.int_hashes) for d in self.chain(token_ids, block_size)]


def hasher_for(
    seed: str | None, algo: str | None = None, int_hashes: bool = True
) -> BlockHasher | None:
    """The hasher for a vLLM server, or None when its hashes cannot be reproduced: no known
    PYTHONHASHSEED (vLLM then seeds with random bytes) or an algorithm we do not know."""
    if seed is None or seed == "":
        return None
    try:
        return BlockHasher(algo or DEFAULT_ALGO, str(seed), int_hashes)
    except UnknownHashAlgo:
        return None
