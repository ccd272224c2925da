"""Routing insight: vLLM's block hashes reproduced (checked against the recipe its source
documents, computed here by hand), predict_hits by hash and by token ids, and two real
`kvscope serve` replicas: a shared system prompt sent to one of them is attributed to it, and
the hit predicted for a new prompt is the hit that replica's engine then reports."""

from __future__ import annotations

import hashlib
import pickle
import time

import cbor2
import httpx
import pytest
import xxhash
from remote_fakes import wait_until
from served import start_server

from kvscope.app.core.block_hashes import ALGOS, BlockHasher, hasher_for
from kvscope.app.remote.connection import parse_connection
from kvscope.app.remote.kv_wire import BlockStored, EventBatch
from kvscope.app.remote.monitor import ReplicaMonitor
from kvscope.app.remote.remote_cache import RemoteCache
from kvscope.app.remote.routing import TOKEN_METHOD, predict_hits

BS = 4
SEED = "1234"


def vllm_chain(algo: str, seed: str, tokens: list[int], bs: int) -> list[int]:
    """vLLM's recipe (kv_cache_utils.hash_block_tokens, init_none_hash, hashing.py), spelled out."""
    serialise = {
        "sha256": lambda x: pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL),
        "sha256_cbor": lambda x: cbor2.dumps(x, canonical=True),
        "xxhash": lambda x: pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL),
        "xxhash_cbor": lambda x: cbor2.dumps(x, canonical=True),
    }[algo]
    if algo.startswith("sha256"):
        digest = lambda x: hashlib.sha256(serialise(x)).digest()  # noqa: E731
    else:
        digest = lambda x: xxhash.xxh3_128_digest(serialise(x))  # noqa: E731
    parent = digest(seed)  # NONE_HASH = hash_fn(os.getenv("PYTHONHASHSEED"))
    out = []
    for i in range(len(tokens) // bs):
        parent = digest((parent, tuple(tokens[i * bs : (i + 1) * bs]), None))
        out.append(int.from_bytes(parent, "big") & ((1 << 64) - 1))  # INT_BLOCK_HASHES=1
    return out


@pytest.mark.parametrize("algo", ALGOS)
def test_block_hashes_follow_vllms_recipe(algo):
    tokens = list(range(50, 50 + 3 * BS + 1))  # three full blocks and a partial one
    hasher = BlockHasher(algo, SEED)
    assert hasher.event_hashes(tokens, BS) == vllm_chain(algo, SEED, tokens, BS)
    assert len(hasher.chain(tokens, BS)[0]) == (32 if algo.startswith("sha256") else 16)
    assert BlockHasher(algo, SEED, int_hashes=False).event_hashes(tokens, BS) == hasher.chain(
        tokens, BS
    )
    assert BlockHasher(algo, "other").event_hashes(tokens, BS) != hasher.event_hashes(tokens, BS)


def test_hashes_that_cannot_be_reproduced():
    # PYTHONHASHSEED unset: vLLM seeds xxhash at random, sha256 with a fixed value
    # (tests/app/serve/test_vllm_kv_events.py checks both against vLLM's own code).
    assert hasher_for(None, "xxhash_cbor") is None and hasher_for("", "xxhash") is None
    assert hasher_for(None, "sha256_cbor").seed == hasher_for("", "sha256").seed
    assert hasher_for(SEED, "xxh3_64_salted") is None  # not an algorithm vLLM has
    assert hasher_for(SEED).algo == "sha256"  # vLLM's default algorithm


def cache_from_events(name: str, hasher: BlockHasher, prompts: list[list[int]]) -> RemoteCache:
    """A replica's cache as its KV events (int hashes, token ids) would build it."""
    cache = RemoteCache(name)
    for tokens in prompts:
        hashes = hasher.event_hashes(tokens, BS)
        event = BlockStored(hashes, None, tokens[: len(hashes) * BS], BS, medium="GPU")
        cache.apply(EventBatch(ts=0.0, events=[event]), now=time.time())
    return cache


@pytest.mark.parametrize("use_hash", [True, False])
def test_predict_hits_for_two_replicas(use_hash):
    hasher = BlockHasher("sha256_cbor", SEED)
    system = list(range(1, 1 + 3 * BS))  # three blocks of a system prompt
    a = cache_from_events("a", hasher, [system + [90] * BS])
    b = cache_from_events("b", hasher, [[7] * (4 * BS)])
    prompt = system + [60, 61, 62, 63, 64, 65]  # a new question after the same system prompt
    hashers = {"a": hasher, "b": hasher} if use_hash else {"a": None, "b": None}
    hits = predict_hits({"a": prompt, "b": prompt}, {"a": a, "b": b}, hashers)
    assert [h.replica for h in hits] == ["a", "b"]
    assert [(h.blocks_held, h.blocks_in_prompt, h.tokens_held) for h in hits] == [
        (3, 4, 3 * BS),
        (0, 4, 0),
    ]
    method = "hash (sha256_cbor)" if use_hash else TOKEN_METHOD
    assert {h.method for h in hits} == {method}


def test_a_wrong_seed_falls_back_to_token_ids_and_says_so():
    """A replica hashing with another seed holds nothing by our hashes, all by tokens: the
    prediction is the token one, and names the likely cause."""
    tokens = list(range(3 * BS))
    theirs = cache_from_events("x", BlockHasher("sha256_cbor", "999"), [tokens])
    (wrong,) = predict_hits({"x": tokens}, {"x": theirs}, {"x": BlockHasher("sha256_cbor", SEED)})
    (by_tokens,) = predict_hits({"x": tokens}, {"x": theirs}, {"x": None})
    assert (wrong.blocks_held, by_tokens.blocks_held) == (3, 3)
    assert wrong.method.startswith(TOKEN_METHOD) and "PYTHONHASHSEED" in wrong.method
    assert by_tokens.method == TOKEN_METHOD


@pytest.fixture(scope="module")
def two_replicas(default_model):
    servers = []
    for name in ("A", "B"):
        srv = start_server(default_model, 64, 512, kv_events=True)
        pub, replay = srv.kv_endpoints
        servers.append((name, srv, parse_connection(srv.base_url, pub, replay, name=name)))
    yield servers
    for _, srv, _ in servers:
        srv.stop()


def test_two_kvscope_replicas_shared_system_prompt(two_replicas):
    (_, srv_a, conn_a), (_, srv_b, conn_b) = two_replicas
    monitors = {c.label: ReplicaMonitor(c, poll_s=0.2).start() for c in (conn_a, conn_b)}
    try:
        system = "You are a careful assistant for a ship's crew; answer in one short sentence. " * 3
        first = [{"role": "system", "content": system}, {"role": "user", "content": "Why tides?"}]
        body = {"model": srv_a.model_name, "messages": first, "max_tokens": 2}
        reply = httpx.post(f"{srv_a.base_url}/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text

        snaps = wait_until(
            lambda: (
                (s := {k: m.snapshot() for k, m in monitors.items()})["A"].cache.num_blocks
                and s["A"].http_state == "up"
                and s["B"].http_state == "up"
                and s
            ),
            what="replica A's blocks and both /metrics",
        )
        # The blocks are attributed to the replica that served the chat.
        assert snaps["B"].cache.num_blocks == 0
        assert snaps["A"].status.state in ("live", "silent") and snaps["A"].status.missed == 0
        assert snaps["A"].block_size == 16 and snaps["B"].block_size == 16  # B: cache_config_info
        assert snaps["A"].model == srv_a.model_name
        # vLLM's sha256 hashes, seeded as vLLM seeds them when PYTHONHASHSEED is unset.
        assert snaps["A"].hasher is not None and "fixed seed" in snaps["A"].hash_note

        second = [
            {"role": "system", "content": system},
            {"role": "user", "content": "What is fog?"},
        ]

        def tokenize(srv):
            r = httpx.post(f"{srv.base_url}/tokenize", json={"messages": second}, timeout=30)
            assert r.status_code == 200, r.text
            return r.json()["tokens"]

        prompts = {"A": tokenize(srv_a), "B": tokenize(srv_b)}
        hits = predict_hits(
            prompts,
            {k: s.cache for k, s in snaps.items()},
            {k: s.hasher for k, s in snaps.items()},
        )
        assert [h.replica for h in hits] == ["A", "B"]
        hit_a, hit_b = hits
        assert hit_a.method == "hash (sha256)" and hit_b.blocks_held == 0
        assert hit_a.blocks_held >= 3  # the system prompt is several blocks long

        # The prediction is what replica A's engine then reuses.
        def hit_tokens(srv):
            return srv.driver.call(lambda e: e.stats()["prefix_cache_hit_tokens"]).result()

        before = hit_tokens(srv_a)
        body = {"model": srv_a.model_name, "messages": second, "max_tokens": 1}
        reply = httpx.post(f"{srv_a.base_url}/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert hit_tokens(srv_a) - before == hit_a.tokens_held
    finally:
        for m in monitors.values():
            m.stop()
