"""KV events, their replay and block hashes, judged by vLLM 0.33.0's own code (tests/vllm_code.py
imports it from vLLM's wheel and source release; nothing of it is copied here).

Both directions:
- our server -> vLLM: vLLM's `KVEventBatch` decoder reads every batch `kvscope serve` publishes,
  the replay client of vLLM's own test suite (MockSubscriber) gets every batch back with its
  topic, and vLLM's example subscriber runs against our server without an error; the blocks
  announced carry the hashes vLLM's hasher gives their token chains;
- vLLM -> us: vLLM's `ZmqEventPublisher` sends events whose hashes vLLM's block hasher computed
  (each algorithm, PYTHONHASHSEED set and unset), and our subscriber, joining late, rebuilds the
  same blocks and parent links, and routing predicts vLLM's hashes."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest
import vllm_code
from remote_fakes import wait_until
from repo_paths import TESTS
from served import engine_event_hashes, free_endpoint, start_server

from kvscope.app.core.block_hashes import ALGOS, hasher_for
from kvscope.app.remote.kv_subscriber import KVEventSubscriber
from kvscope.app.remote.remote_cache import RemoteCache
from kvscope.app.remote.routing import predict_hits

BLOCK_SIZE = 16
TOPIC = "kv-events"


@pytest.fixture(scope="module")
def vllm():
    """vLLM's kv_events, kv_cache_utils and hashing modules, as its wheel ships them."""
    return (
        vllm_code.module("vllm.distributed.kv_events"),
        vllm_code.module("vllm.v1.core.kv_cache_utils"),
        vllm_code.module("vllm.utils.hashing"),
    )


class VllmHasher:
    """vLLM's own block hashing (init_none_hash, hash_block_tokens, maybe_convert_block_hash),
    in the shape tests/served.engine_event_hashes takes."""

    int_hashes = True

    def __init__(self, vllm, algo: str) -> None:
        _, self.utils, hashing = vllm
        self.fn = hashing.get_hash_fn_by_name(algo)
        self.utils.init_none_hash(self.fn)  # reads PYTHONHASHSEED now, as vLLM's engine does

    def hash_block(self, parent, tokens):
        return self.utils.hash_block_tokens(self.fn, parent, tokens)

    def chain(self, tokens) -> list[bytes]:
        digests, parent = [], None
        for i in range(len(tokens) // BLOCK_SIZE):
            parent = self.hash_block(parent, tokens[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE])
            digests.append(parent)
        return digests

    def external(self, digest):
        return self.utils.maybe_convert_block_hash(digest)


# ---- our server, read by vLLM's code -------------------------------------------------------------
@pytest.fixture(scope="module")
def served(default_model):
    # A small pool, so that the traffic below evicts cached blocks (BlockRemoved).
    srv = start_server(
        default_model, 24, block_size=BLOCK_SIZE, kv_events=True, kv_events_topic=TOPIC
    )
    yield srv
    srv.stop()


def _traffic(srv) -> None:
    system = "You are a careful assistant who answers in one short sentence. " * 3
    for i, question in enumerate(["Why is the sky blue?", "What is rain?", "Name a fruit."]):
        body = {
            "model": srv.model_name,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"{question} ({i})"},
            ],
            "max_tokens": 8,
            "n": 2,
            "seed": i,
        }
        reply = httpx.post(f"{srv.base_url}/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
    for topic in ("oceans", "mountains", "rivers", "forests"):
        body = {"model": srv.model_name, "prompt": f"Tell me about {topic}. " * 14, "max_tokens": 4}
        reply = httpx.post(f"{srv.base_url}/v1/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text


def _cached_after(vllm, batches) -> tuple[set, dict]:
    """Replay vLLM-decoded batches into (cached hashes, stored/removed/cleared counts), checking
    each stored run's parent is held (or absent for a prompt's first block)."""
    events = vllm[0]
    cached: set = set()
    counts = {"stored": 0, "removed": 0, "cleared": 0}
    for batch in batches:
        assert batch.data_parallel_rank == 0
        for event in batch.events:
            if isinstance(event, events.BlockStored):
                assert event.block_size == BLOCK_SIZE and event.medium == "GPU"
                assert len(event.token_ids) == BLOCK_SIZE * len(event.block_hashes)
                assert event.parent_block_hash is None or event.parent_block_hash in cached
                cached.update(event.block_hashes)
                counts["stored"] += len(event.block_hashes)
            elif isinstance(event, events.BlockRemoved):
                assert set(event.block_hashes) <= cached
                cached.difference_update(event.block_hashes)
                counts["removed"] += len(event.block_hashes)
            else:
                assert isinstance(event, events.AllBlocksCleared)
                cached.clear()
                counts["cleared"] += 1
    return cached, counts


def test_vllm_decodes_and_replays_every_batch_our_server_publishes(vllm, served):
    conftest = vllm_code.vllm_test_module("tests/distributed/conftest.py")
    pub, replay = served.kv_endpoints
    sub = conftest.MockSubscriber(pub, replay, TOPIC, decode_type=vllm[0].KVEventBatch)
    try:
        time.sleep(0.3)  # ZMQ's slow joiner: let the subscription reach the publisher
        _traffic(served)
        live = []
        while (got := sub.receive_one(timeout=2000)) is not None:  # vLLM's decoder, each batch
            live.append(got)
        assert live, "no live batch arrived"
        # vLLM's test client asks for everything from seq 0 and reads topic, seq, payload.
        sub.request_replay(0)
        replayed = sub.receive_replay()
        seqs = [seq for seq, _ in replayed]
        assert seqs == list(range(len(seqs))) and seqs[-1] == live[-1][0]
        assert [b for s, b in replayed if s >= live[0][0]] == [b for _, b in live]
        # Seq 0 went out before anyone listened: the pool as it stood, opened by a clear.
        assert isinstance(replayed[0][1].events[0], vllm[0].AllBlocksCleared)
        cached, counts = _cached_after(vllm, [b for _, b in replayed])
        stats = served.driver.call(lambda e: e.stats()).result()
        assert stats["prefix_cache_evictions"] > 0  # the small pool did evict
        assert counts["removed"] == stats["prefix_cache_evictions"]
        assert counts["cleared"] == 1 and counts["stored"] > 0
        # The hashes are the ones vLLM's own hasher gives each cached block's token chain.
        assert cached == engine_event_hashes(served, VllmHasher(vllm, "sha256"))
    finally:
        sub.close()


def test_vllm_rejects_the_array_layout_we_keep_behind_a_flag(vllm):
    import msgspec

    from kvscope.app.serve.kv_events import event_structs

    decoder = msgspec.msgpack.Decoder(type=vllm[0].KVEventBatch)
    for encoding, decodes in (("map", True), ("array", False)):
        structs = event_structs(encoding)
        removed = structs["BlockRemoved"](block_hashes=[7], medium="GPU", group_idx=0)
        payload = msgspec.msgpack.encode(structs["KVEventBatch"](ts=1.0, events=[removed]))
        if decodes:
            assert decoder.decode(payload).events == [
                vllm[0].BlockRemoved(block_hashes=[7], medium="GPU", group_idx=0)
            ]
        else:
            with pytest.raises(msgspec.ValidationError, match="Expected `object`, got `array`"):
                decoder.decode(payload)


@pytest.mark.parametrize("algo", ALGOS)
def test_our_hashes_are_vllms_for_every_algorithm(vllm, algo, monkeypatch):
    from kvscope.app.serve.kv_events import vllm_hasher

    tokens = list(range(1000, 1000 + 5 * BLOCK_SIZE + 3))
    for seed in ("0", "kvscope", None):
        if seed is None:
            monkeypatch.delenv("PYTHONHASHSEED", raising=False)
        else:
            monkeypatch.setenv("PYTHONHASHSEED", seed)
        theirs = VllmHasher(vllm, algo)
        ours = vllm_hasher(algo)  # what `kvscope serve --prefix-caching-hash-algo` publishes
        expected = theirs.chain(tokens)
        reproducible = seed is not None or algo in ("sha256", "sha256_cbor")
        # A random per-process seed (xxhash, seed unset) is random on both sides.
        assert (ours.chain(tokens, BLOCK_SIZE) == expected) == reproducible
        predicted = hasher_for(seed, algo)  # what the remote view predicts for a vLLM server
        assert (predicted is not None) == reproducible
        if predicted is not None:
            assert predicted.event_hashes(tokens, BLOCK_SIZE) == [
                theirs.external(d) for d in expected
            ]


def test_vllm_example_subscriber_reads_our_server(default_model, tmp_path):
    """vLLM's examples/features/kv_events/kv_events_subscriber.py, run unmodified: it listens on
    tcp://localhost:5557 (replay 5558) for topic "kv-events", so our server binds those."""
    example = vllm_code.sdist_file("examples/features/kv_events/kv_events_subscriber.py")
    try:
        srv = start_server(
            default_model,
            24,  # small enough to evict: BlockRemoved too
            block_size=BLOCK_SIZE,
            kv_events=("tcp://*:5557", "tcp://*:5558"),
            kv_events_topic=TOPIC,
        )
    except ValueError as e:
        pytest.fail(f"the example's fixed ports are taken on this machine: {e}")
    run = (
        "import runpy, sys; sys.path.insert(0, sys.argv[1]); import vllm_code; "
        "vllm_code.install(); runpy.run_path(sys.argv[2], run_name='__main__')"
    )
    out = tmp_path / "example.out"
    with open(out, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-u", "-c", run, str(TESTS), str(example)],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: "Listening" in out.read_text(), timeout=60, what="the example")
        time.sleep(0.5)  # its subscription reaches our publisher
        _traffic(srv)
        wait_until(lambda: "BlockStored" in out.read_text(), timeout=30, what="a BlockStored")
        time.sleep(1.0)
    finally:
        proc.terminate()
        proc.wait(10)
        srv.stop()
    text = out.read_text()
    assert "Error decoding message" not in text, text[-3000:]
    assert text.count("Received event batch") >= 3 and "BlockRemoved" in text


# ---- vLLM's publisher, followed by our subscriber ------------------------------------------------
def _vllm_batches(vllm, hasher: VllmHasher, prompts: list[list[int]]):
    """One vLLM KVEventBatch per prompt, the blocks hashed by vLLM, then one evicting the last
    prompt's tail block; and the (hash, parent) links that result."""
    events = vllm[0]
    batches, links = [], {}
    for tokens in prompts:
        digests = hasher.chain(tokens)
        hashes = [hasher.external(d) for d in digests]
        stored = events.BlockStored(
            block_hashes=hashes,
            parent_block_hash=None,
            token_ids=tokens[: len(hashes) * BLOCK_SIZE],
            block_size=BLOCK_SIZE,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            group_idx=0,
        )
        batches.append(events.KVEventBatch(ts=time.time(), events=[stored]))
        links.update(zip(hashes, [None] + hashes[:-1], strict=True))
    tail = hashes[-1]
    batches.append(
        events.KVEventBatch(
            ts=time.time(), events=[events.BlockRemoved(block_hashes=[tail], medium="GPU")]
        )
    )
    del links[tail]
    return batches, links


def _vllm_endpoints() -> tuple[str, str, str, str]:
    """(pub bind, replay bind, pub connect, replay connect): vLLM's publisher binds only
    endpoints with a wildcard host (ZmqEventPublisher._is_bind_endpoint)."""
    pub, replay = free_endpoint(), free_endpoint()
    wild = [e.replace("127.0.0.1", "*") for e in (pub, replay)]
    return wild[0], wild[1], pub, replay


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("seed", [None, "42"])
def test_our_subscriber_follows_vllms_publisher(vllm, algo, seed, monkeypatch):
    if seed is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", seed)
    hasher = VllmHasher(vllm, algo)
    shared = list(range(7, 7 + 2 * BLOCK_SIZE))  # a system prompt both prompts share
    prompts = [shared + list(range(500, 500 + 3 * BLOCK_SIZE + 5)), shared + [9] * BLOCK_SIZE]
    batches, links = _vllm_batches(vllm, hasher, prompts)
    pub_bind, replay_bind, pub, replay = _vllm_endpoints()
    publisher = vllm[0].ZmqEventPublisher(
        data_parallel_rank=0, endpoint=pub_bind, replay_endpoint=replay_bind, topic=TOPIC
    )
    cache = RemoteCache("vllm")
    sub = KVEventSubscriber(
        pub, replay, topic=TOPIC, on_batch=lambda s, b: cache.apply(b, time.time())
    )
    try:
        for batch in batches[:2]:  # before we listen: only the replay can give these back
            publisher.publish(batch)
        time.sleep(0.3)
        sub.start()
        wait_until(lambda: sub.status().last_seq == 1, what="the replayed history")
        for batch in batches[2:]:
            publisher.publish(batch)
        wait_until(lambda: sub.status().last_seq == len(batches) - 1, what="the live batches")
        status = sub.status()
        assert (status.missed, status.malformed, status.first_seq) == (0, 0, 0)
        assert status.recovered >= 2
        # The same blocks and parent links as vLLM announced.
        assert {h: b.parent_hash for (_, h), b in cache.blocks.items()} == links
        # Routing predicts vLLM's hashes where they are reproducible, else matches token ids;
        # either way it finds the blocks held.
        predicted = hasher_for(seed, algo)
        reproducible = seed is not None or algo in ("sha256", "sha256_cbor")
        # The second prompt's tail block was evicted: only the shared system prompt is held.
        for tokens, held in ((prompts[0], len(prompts[0]) // BLOCK_SIZE), (prompts[1], 2)):
            hits = predict_hits({"vllm": tokens}, {"vllm": cache}, {"vllm": predicted})
            assert hits[0].blocks_held == held
            assert hits[0].method == (f"hash ({algo})" if reproducible else "token ids")
    finally:
        sub.stop()
        publisher.shutdown()


def test_a_late_subscriber_counts_what_vllms_bounded_buffer_lost(vllm):
    pub_bind, replay_bind, pub, replay = _vllm_endpoints()
    publisher = vllm[0].ZmqEventPublisher(
        data_parallel_rank=0,
        endpoint=pub_bind,
        replay_endpoint=replay_bind,
        buffer_steps=3,
        topic=TOPIC,
    )
    events = vllm[0]
    seen = []
    sub = KVEventSubscriber(pub, replay, topic=TOPIC, on_batch=lambda s, b: seen.append(s))
    try:
        for i in range(5):
            publisher.publish(events.KVEventBatch(ts=float(i), events=[events.AllBlocksCleared()]))
        time.sleep(0.3)
        sub.start()
        wait_until(lambda: seen == [2, 3, 4], what="what vLLM's buffer still holds")
        status = sub.status()
        assert (status.first_seq, status.missed, status.recovered) == (2, 2, 3)
    finally:
        sub.stop()
        publisher.shutdown()
