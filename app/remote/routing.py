"""The cache-aware routing question: of a new prompt's full blocks, how many leading ones does
each replica already hold (and so need not prefill)?

By hash when the replica's hashes can be reproduced (app/core/block_hashes.py): the prompt's
chain is hashed as the server would, and each hash looked up among the blocks its events
announced, in whichever form they carry (64-bit int or digest bytes). Otherwise by token ids:
the events carry each block's tokens, so a block matches when its tokens and its parent link
do (RemoteCache.held_prefix_blocks). Token ids are checked too when hashing: more blocks held
by tokens than by hash means the hasher's seed is wrong, and the answer says so. Both count
leading blocks only: a cached block past the first miss is not reused, since its key includes
the whole prefix."""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.app.core.block_hashes import BlockHasher, external_hash
from kvscope.app.remote.remote_cache import RemoteCache

TOKEN_METHOD = "token ids"


@dataclass(frozen=True)
class RouteHit:
    replica: str
    blocks_held: int
    blocks_in_prompt: int
    tokens_held: int
    method: str  # "hash (sha256_cbor)" | ... | "token ids"
    block_size: int | None = None

    @property
    def share(self) -> float:
        return self.blocks_held / self.blocks_in_prompt if self.blocks_in_prompt else 0.0


def predict_hits(
    prompt_token_ids: dict[str, list[int]],
    caches: dict[str, RemoteCache],
    hashers: dict[str, BlockHasher | None],
    block_sizes: dict[str, int | None] | None = None,
) -> list[RouteHit]:
    """One RouteHit per replica in `caches` that has the prompt's tokens (each replica
    tokenizes for itself), most blocks held first. `block_sizes` overrides the size the
    cache learnt from its events (a replica that has sent none yet)."""
    hits: list[RouteHit] = []
    for replica, cache in caches.items():
        tokens = prompt_token_ids.get(replica)
        if tokens is None:
            continue
        bs = (block_sizes or {}).get(replica) or cache.block_size
        if not bs:
            hits.append(RouteHit(replica, 0, 0, 0, "no block size known yet"))
            continue
        in_prompt = len(tokens) // bs
        hasher = hashers.get(replica)
        held = cache.held_prefix_blocks(tokens, bs)
        method = TOKEN_METHOD
        if hasher is not None:
            by_hash = _held_by_hash(cache, hasher, tokens, bs)
            if by_hash >= held:
                held, method = by_hash, hasher.method
            else:
                # The events hold blocks with these very tokens under other keys: the server's
                # seed is not the one assumed (a PYTHONHASHSEED nobody told us). Say so.
                method = f"{TOKEN_METHOD} ({hasher.algo} hashes do not match: PYTHONHASHSEED?)"
        hits.append(RouteHit(replica, held, in_prompt, held * bs, method, bs))
    hits.sort(key=lambda h: (-h.blocks_held, -h.share, h.replica))
    return hits


def _held_by_hash(cache: RemoteCache, hasher: BlockHasher, tokens: list[int], bs: int) -> int:
    held = 0
    for digest in hasher.chain(tokens, bs):
        forms = (external_hash(digest, True), digest)
        if not any(cache.holds(h) for h in forms):
            break
        held += 1
    return held
