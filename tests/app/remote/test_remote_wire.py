"""KV event payloads built from vLLM's documented schema (msgspec structs declared here, as
vllm/distributed/kv_events.py declares them) decode with app.remote.kv_wire, whichever layout,
with fields a newer vLLM appends and fields an older one lacks; a sequence number lost on the
way is filled from the replay socket."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from remote_fakes import FakeKVServer, wait_until

from kvscope.app.remote.kv_subscriber import KVEventSubscriber
from kvscope.app.remote.kv_wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    MalformedFrame,
    decode_batch,
)


# ---- vLLM's schema, array layout (its example subscriber; releases before PR #42892) -----------
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class VllmBlockStored(KVCacheEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None


class VllmBlockRemoved(KVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class VllmAllBlocksCleared(KVCacheEvent, tag="AllBlocksCleared"):
    pass


class KVEventBatch(EventBatch):
    events: list[VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared]


# A vLLM from the future: one more field appended to BlockStored (after the ones we know).
class FutureBlockStored(KVCacheEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None
    group_idx: int | None
    kv_cache_spec_kind: str | None
    kv_cache_spec_sliding_window: int | None
    speculative_tier: str  # not in any vLLM we read


class FutureBatch(EventBatch):
    events: list[FutureBlockStored]


# An old vLLM: BlockStored before `medium` and `lora_name` existed.
class OldBlockStored(KVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class OldBatch(EventBatch):
    events: list[OldBlockStored]


# ---- the map layout (vLLM after PR #42892): events keyed by field, tag under "type" -----------
class MapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class MapBlockStored(MapEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    group_idx: int | None = None
    a_new_key: dict[str, int] | None = None  # unknown to us


class MapBlockRemoved(MapEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class MapBatch(EventBatch):
    events: list[MapBlockStored | MapBlockRemoved | VllmAllBlocksCleared]


BS = 4


def encode(batch) -> bytes:
    return msgspec.msgpack.encode(batch)


def stored(hashes, parent=None, group=None, cls=VllmBlockStored, **extra):
    tokens = list(range(100, 100 + BS * len(hashes)))
    return cls(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=BS,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        group_idx=group,
        **extra,
    )


def test_array_layout_all_three_events():
    batch = KVEventBatch(
        ts=12.5,
        events=[
            stored([11, 12], parent=None, group=1),
            VllmBlockRemoved(block_hashes=[11], medium="GPU", group_idx=1),
            VllmAllBlocksCleared(),
        ],
        data_parallel_rank=3,
    )
    got = decode_batch(encode(batch))
    assert got.ts == 12.5 and got.dp_rank == 3
    assert got.events == [
        BlockStored([11, 12], None, list(range(100, 108)), BS, group_idx=1, medium="GPU"),
        BlockRemoved([11], group_idx=1, medium="GPU"),
        AllBlocksCleared(),
    ]


def test_map_layout_with_unknown_keys_and_bytes_hashes():
    # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: the hashes are the 32-byte digests.
    h1, h2 = b"\x01" * 32, b"\x02" * 32
    batch = MapBatch(
        ts=1.0,
        events=[
            stored([h1, h2], parent=b"\x09" * 32, cls=MapBlockStored, a_new_key={"x": 1}),
            MapBlockRemoved(block_hashes=[h2], medium="CPU"),
        ],
    )
    raw = msgspec.msgpack.decode(encode(batch))
    assert raw[1][0]["a_new_key"] == {"x": 1}  # the unknown key is on the wire
    got = decode_batch(encode(batch))
    assert got.dp_rank is None
    first, second = got.events
    assert first.block_hashes == [h1, h2] and first.parent_block_hash == b"\x09" * 32
    assert first.group_idx == 0 and first.token_ids == list(range(100, 108))
    assert second == BlockRemoved([h2], group_idx=0, medium="CPU")


def test_newer_vllm_appended_fields_are_ignored():
    event = FutureBlockStored(
        block_hashes=[5],
        parent_block_hash=4,
        token_ids=[1, 2, 3, 4],
        block_size=BS,
        lora_id=None,
        medium="GPU",
        lora_name="adapter",
        extra_keys=[None],
        group_idx=2,
        kv_cache_spec_kind="sliding_window",
        kv_cache_spec_sliding_window=128,
        speculative_tier="hbm",
    )
    payload = encode(FutureBatch(ts=2.0, events=[event], data_parallel_rank=0))
    assert len(msgspec.msgpack.decode(payload)[1][0]) == 13  # tag + 12 fields on the wire
    (got,) = decode_batch(payload).events
    assert got == BlockStored(
        [5], 4, [1, 2, 3, 4], BS, group_idx=2, medium="GPU", lora_name="adapter"
    )


def test_older_vllm_missing_fields_take_defaults():
    event = OldBlockStored(
        block_hashes=[7],
        parent_block_hash=None,
        token_ids=[9, 9, 9, 9],
        block_size=BS,
        lora_id=None,
    )
    (got,) = decode_batch(encode(OldBatch(ts=0.5, events=[event]))).events
    assert got == BlockStored([7], None, [9, 9, 9, 9], BS, group_idx=0, medium=None)


def test_our_publisher_structs_decode_both_layouts():
    from kvscope.app.serve.kv_events import event_structs

    for encoding in ("array", "map"):
        s = event_structs(encoding)
        batch = s["KVEventBatch"](
            ts=3.0,
            events=[
                s["AllBlocksCleared"](),
                s["BlockStored"](
                    block_hashes=[2**64 - 1],
                    parent_block_hash=None,
                    token_ids=[1, 2, 3, 4],
                    block_size=BS,
                    lora_id=None,
                    medium="GPU",
                    lora_name=None,
                    group_idx=0,
                ),
            ],
            data_parallel_rank=0,
        )
        got = decode_batch(encode(batch))
        assert got.events[0] == AllBlocksCleared()
        assert got.events[1].block_hashes == [2**64 - 1], encoding


@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"\xc1", "not msgpack"),
        (msgspec.msgpack.encode("hello"), "a batch is"),
        (msgspec.msgpack.encode(["x", []]), "ts must be a number"),
        (msgspec.msgpack.encode([1.0, {}]), "events must be a list"),
        (msgspec.msgpack.encode([1.0, [["Teleported", [1]]]]), "unknown event type"),
        (msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved"}]]), "missing block_hashes"),
        (msgspec.msgpack.encode([1.0, [["BlockRemoved", ["a"], None]]]), "block_hashes must"),
        (msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, [1], 0]]]), "block_size"),
        (msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, "abc", 4]]]), "token_ids"),
        (msgspec.msgpack.encode([1.0, [7]]), "an array or map"),
    ],
)
def test_malformed_payloads_name_the_problem(payload, reason):
    with pytest.raises(MalformedFrame, match=reason):
        decode_batch(payload)


def test_a_missed_sequence_number_is_filled_from_the_replay_socket():
    server = FakeKVServer()
    got: list[tuple[int, Any]] = []
    sub = KVEventSubscriber(
        server.pub_endpoint, server.replay_endpoint, on_batch=lambda s, b: got.append((s, b))
    )
    try:
        # Seq 0 goes out before anyone listens: the subscriber's first replay brings it.
        server.publish(encode(KVEventBatch(ts=0.0, events=[VllmAllBlocksCleared()])))
        sub.start()
        wait_until(lambda: [s for s, _ in got] == [0], what="seq 0 from the replay")
        for seq in (1, 2, 3):
            batch = KVEventBatch(ts=float(seq), events=[stored([seq], parent=seq - 1 or None)])
            # seq 2 is lost on the way: only the replay buffer has it.
            server.publish(encode(batch), live=seq != 2)
        wait_until(lambda: len(got) == 4, what="seqs 1-3")
        assert [s for s, _ in got] == [0, 1, 2, 3]
        assert [b.events[0].block_hashes for _, b in got[1:]] == [[1], [2], [3]]
        assert server.replay_requests == [0, 2]  # the history, then the gap
        status = sub.status()
        # Recovered: seq 0, and 2 and 3 (the replay answers with all it buffered from 2, and 3
        # was buffered before it went out live; its live copy is then dropped as a duplicate).
        assert (status.recovered, status.missed, status.malformed) == (3, 0, 0)
        assert status.last_seq == 3 and status.restarts == 0
        assert status.resets == 0  # seq 0's AllBlocksCleared opened the stream
        server.publish(encode(KVEventBatch(ts=4.0, events=[VllmAllBlocksCleared()])))
        wait_until(lambda: sub.status().resets == 1, what="a reset mid-stream")
    finally:
        sub.stop()
        server.close()


def test_an_absurd_block_size_is_malformed():
    """One event must not set a replica's block size to 10^7 (the view sizes by it)."""
    import msgspec

    from kvscope.app.remote.kv_wire import MAX_BLOCK_SIZE, MalformedFrame, decode_batch

    def batch(size):
        event = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None}
        event |= {"token_ids": [0] * 4, "block_size": size, "medium": "GPU"}
        return msgspec.msgpack.encode([0.0, [event], 0])

    assert decode_batch(batch(MAX_BLOCK_SIZE)).events[0].block_size == MAX_BLOCK_SIZE
    with pytest.raises(MalformedFrame, match="block_size"):
        decode_batch(batch(10**7))
