"""KV events as vLLM publishes them: a subscriber decodes them with msgspec structs declared
here from vLLM's schema (vllm/distributed/kv_events.py, the layout of its example subscriber),
follows the sequence numbers, fills gaps from the replay socket, and rebuilds the set of cached
block hashes, which must equal the engine's own."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import openai
import pytest
import zmq
from served import start_server

from app.serve.kv_events import event_structs


# ---- vLLM's schema, as a consumer declares it ---------------------------------------------------
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


# The layout of vLLM after its PR #42892: events as maps keyed by field, tag under "type".
class MapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class MapBlockStored(MapEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    group_idx: int | None = None


class MapBlockRemoved(MapEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class MapBatch(EventBatch):
    events: list[MapBlockStored | MapBlockRemoved]


BLOCK_SIZE = 16


class Subscriber:
    """vLLM's example subscriber, made exact: every seq applied once, in order."""

    def __init__(self, pub: str, replay: str, drop_seq: int) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(pub)
        # DEALER, not vLLM's example's REQ: a REQ socket takes one reply per request, and the
        # replay answers with every buffered batch from the start seq, then an end marker.
        self.replay = self.ctx.socket(zmq.DEALER)
        self.replay.connect(replay)
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.next_seq = 0
        self.drop_seq = drop_seq  # pretend the network lost this one
        self.cached: set[int] = set()
        self.replayed: list[int] = []
        self.counts = {"stored": 0, "removed": 0, "cleared": 0}

    def _apply(self, payload: bytes) -> None:
        batch = self.decoder.decode(payload)
        assert batch.data_parallel_rank == 0
        for event in batch.events:
            if isinstance(event, BlockStored):
                assert event.block_size == BLOCK_SIZE and event.medium == "GPU"
                assert len(event.token_ids) == BLOCK_SIZE * len(event.block_hashes)
                # A run continues a block the cache holds, or starts a prompt.
                assert event.parent_block_hash is None or event.parent_block_hash in self.cached
                self.cached.update(event.block_hashes)
                self.counts["stored"] += len(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                assert set(event.block_hashes) <= self.cached
                self.cached.difference_update(event.block_hashes)
                self.counts["removed"] += len(event.block_hashes)
            else:
                self.cached.clear()
                self.counts["cleared"] += 1

    def _fill_from_replay(self, upto: int) -> None:
        self.replay.send_multipart([b"", self.next_seq.to_bytes(8, "big")])
        while True:
            assert self.replay.poll(10_000), "no answer from the replay socket"
            empty, seq_bytes, payload = self.replay.recv_multipart()
            assert empty == b""
            if not payload:  # end marker: seq -1, empty payload
                assert int.from_bytes(seq_bytes, "big", signed=True) == -1
                break
            seq = int.from_bytes(seq_bytes, "big")
            if self.next_seq <= seq < upto:
                assert seq == self.next_seq
                self._apply(payload)
                self.replayed.append(seq)
                self.next_seq += 1
        assert self.next_seq == upto

    def poll(self, timeout_ms: int) -> bool:
        if not self.sub.poll(timeout_ms):
            return False
        topic, seq_bytes, payload = self.sub.recv_multipart()
        assert topic == b""
        seq = int.from_bytes(seq_bytes, "big")
        if seq == self.drop_seq:
            self.drop_seq = -1
            return True
        if seq < self.next_seq:
            return True  # already applied from the replay
        if seq > self.next_seq:
            self._fill_from_replay(seq)
        self._apply(payload)
        self.next_seq = seq + 1
        return True

    def close(self) -> None:
        self.ctx.destroy(linger=0)


@pytest.fixture(scope="module")
def served(default_model):
    # A small pool, so that the traffic below evicts cached blocks (BlockRemoved).
    srv = start_server(default_model, 16, block_size=BLOCK_SIZE, kv_events=True)
    pub, replay = srv.kv_endpoints
    yield srv, pub, replay
    srv.stop()


def _engine_cached_hashes(srv) -> set[int]:
    def read(engine):
        total = engine.stats()["kv_blocks_total"]
        keys = (engine.block_hash(b) for b in range(total))
        return {key[0] for key in keys if key is not None}

    return srv.engine_loop.call(read).result(timeout=60)


def test_subscriber_rebuilds_the_engines_cached_blocks(served):
    srv, pub, replay = served
    # Seq 0 (AllBlocksCleared, the pool as it was) went out before anyone subscribed, and seq 2
    # is "lost": both must come back from the replay socket.
    sub = Subscriber(pub, replay, drop_seq=2)
    try:
        time.sleep(0.3)  # ZMQ's slow joiner: let the subscription reach the publisher
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="-", max_retries=0)
        system = "You are a careful assistant who answers in one short sentence. " * 3
        for i, question in enumerate(["Why is the sky blue?", "What is rain?", "Name a fruit."]):
            client.chat.completions.create(
                model=srv.model_name,
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"{question} ({i})"},
                ],
                max_tokens=8,
                n=2,
                seed=i,
            )
        for topic in ("oceans", "mountains", "rivers", "forests"):
            prompt = f"Tell me about {topic}. " * 14  # ~5 full blocks each: 16 cannot hold all
            client.completions.create(model=srv.model_name, prompt=prompt, max_tokens=4)
        expected = _engine_cached_hashes(srv)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sub.cached != expected:
            sub.poll(200)
        assert sub.cached == expected
        assert 0 in sub.replayed and 2 in sub.replayed
        stats = srv.engine_loop.call(lambda e: e.stats()).result()
        assert stats["prefix_cache_evictions"] > 0  # the small pool did evict
        assert sub.counts["removed"] == stats["prefix_cache_evictions"]
        assert sub.counts["cleared"] == 1 and sub.counts["stored"] > 0
    finally:
        sub.close()


def test_map_layout_decodes_with_vllm_map_structs():
    """The layout of newer vLLM (--kv-events-encoding map) decodes with its structs."""
    structs = event_structs("map")
    stored = structs["BlockStored"](
        block_hashes=[2**64 - 1, 7],
        parent_block_hash=None,
        token_ids=list(range(2 * BLOCK_SIZE)),
        block_size=BLOCK_SIZE,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        group_idx=0,
    )
    removed = structs["BlockRemoved"](block_hashes=[7], medium="GPU", group_idx=0)
    batch = structs["KVEventBatch"](ts=1.5, events=[stored, removed], data_parallel_rank=0)
    payload = msgspec.msgpack.encode(batch)
    raw = msgspec.msgpack.decode(payload)
    assert raw[0] == 1.5 and raw[1][0]["type"] == "BlockStored"  # array batch, map events
    decoded = msgspec.msgpack.Decoder(type=MapBatch).decode(payload)
    assert decoded.events[0].block_hashes == [2**64 - 1, 7]
    assert decoded.events[1] == MapBlockRemoved(block_hashes=[7], medium="GPU")
    # The array layout is what vLLM's example subscriber (declared above) reads.
    array = event_structs("array")
    legacy = array["KVEventBatch"](ts=2.0, events=[array["AllBlocksCleared"]()])
    assert isinstance(
        msgspec.msgpack.Decoder(type=KVEventBatch).decode(msgspec.msgpack.encode(legacy)).events[0],
        AllBlocksCleared,
    )
