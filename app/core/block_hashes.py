"""Reproduce a vLLM server's prefix-cache block hashes, so routing can ask "does replica R hold
block h of this prompt?" with the very keys R's KV events carry. `kvscope serve` publishes the
same hashes (app/serve/kv_events.py), so one hasher serves both.

As vLLM 0.33.0 computes them (vllm/v1/core/kv_cache_utils.py, vllm/utils/hashing.py; checked by
tests/test_vllm_hashes.py, which hashes with vLLM's own functions from its wheel):

- block i of a prompt (full blocks only, `block_size` tokens each) hashes
  `hash_fn((parent, tuple(tokens_i), extra_keys))`, `parent` being block i-1's digest, or for
  the first block NONE_HASH; `extra_keys` is None unless the request has a LoRA adapter, a
  cache_salt, multimodal inputs or prompt embeddings (those we cannot reproduce: such blocks
  simply do not match);
- NONE_HASH = `hash_fn(seed)`: the server's PYTHONHASHSEED when set; unset, the fixed
  "vllm-none-hash" for sha256 / sha256_cbor (cryptographic: shareable across processes), and
  32 random bytes for xxhash / xxhash_cbor (no one outside the server can reproduce those);
- hash_fn by algorithm (CacheConfig.prefix_caching_hash_algo): "sha256" (the default):
  SHA-256 of `pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)`; "sha256_cbor": SHA-256 of
  `cbor2.dumps(x, canonical=True)`; "xxhash" / "xxhash_cbor": the xxh3-128 digest of the same
  serialisations;
- the KV events carry `int.from_bytes(digest, "big") & (2**64 - 1)` (the low 64 bits) when
  VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default, else the digest bytes; the chain itself
  always runs on the full digests.

Pickle-based hashes depend on the pickle format (stable for bytes, tuples of ints and None at
protocol 5, but vLLM warns they may differ across Python versions); the CBOR ones are meant to
be reproducible."""

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
# vLLM's NONE_HASH seed when PYTHONHASHSEED is unset and the algorithm is cryptographic.
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
CRYPTO_ALGOS = ("sha256", "sha256_cbor")
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


def none_hash_seed(seed: str | None, algo: str) -> str | None:
    """The seed a vLLM server derives NONE_HASH from, given its PYTHONHASHSEED (None: unset);
    None when that seed is random (an xxhash algorithm with no PYTHONHASHSEED)."""
    if seed is not None:
        return seed
    return DEFAULT_NONE_HASH_SEED if algo in CRYPTO_ALGOS else None


def hasher_for(
    seed: str | None, algo: str | None = None, int_hashes: bool = True
) -> BlockHasher | None:
    """The hasher for a vLLM server whose PYTHONHASHSEED is `seed` (None or "": unset), or None
    when its hashes cannot be reproduced: a random seed, or an algorithm we do not know."""
    algo = algo or DEFAULT_ALGO
    resolved = none_hash_seed(seed if seed != "" else None, algo)
    if resolved is None:
        return None
    try:
        return BlockHasher(algo, str(resolved), int_hashes)
    except UnknownHashAlgo:
        return None
