"""A big KV event frame is decoded a slice at a time (app/remote/kv_frames.py, issue 43 item 5):
the same blocks as one whole decode, from frames vLLM's own classes encode (and our publisher's
array layout), no msgspec call building values from more than a slice's bytes, a batch that
stores more blocks than the replica's pool refused before its blocks are decoded, a ts that is
NaN or infinite refused, and the piecewise array reader's edge cases."""

from __future__ import annotations

import math
import re

import msgspec
import pytest
from big_kv_frames import BS, flat, frame, stored_events, vllm_events

from kvscope.app.remote import kv_frames, msgpack_pieces
from kvscope.app.remote.kv_frames import SLICE_BLOCKS, SLICE_BYTES, decoding
from kvscope.app.remote.kv_stream import KVStream
from kvscope.app.remote.kv_wire import BlockStored, MalformedFrame, decode_batch
from kvscope.app.remote.msgpack_pieces import NotMsgpack, array_pieces


def sliced(payload: bytes, max_stored: int | None = None):
    """(the batch, how many times the decoding yielded)."""
    steps, slices = decoding(payload, max_stored), 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, slices
        slices += 1


class Recording:
    """A msgspec decoder that notes the size of everything it is given."""

    def __init__(self, decoder, sizes: list[int]) -> None:
        self.decoder, self.sizes = decoder, sizes

    def decode(self, data):
        self.sizes.append(len(data))
        return self.decoder.decode(data)


@pytest.fixture
def value_decodes(monkeypatch) -> list[int]:
    """The input sizes of every msgspec call that builds values (not `Raw` skims)."""
    sizes: list[int] = []
    for module, name in (
        (kv_frames, "_decoder"),
        (msgpack_pieces, "_decoder"),
        (msgpack_pieces, "_tuple"),
    ):
        monkeypatch.setattr(module, name, Recording(getattr(module, name), sizes))
    return sizes


@pytest.mark.parametrize("per_event", [None, 16], ids=["one event", "an event a prompt"])
def test_a_big_vllm_frame_decodes_in_slices_to_the_blocks_a_whole_decode_gives(
    per_event, value_decodes
):
    events = stored_events(60_000, per_event)
    payload = frame(events, ts=5.0)
    assert len(payload) > 10 * SLICE_BYTES
    whole = decode_batch(payload)
    batch, slices = sliced(payload)
    assert flat(batch.events) == flat(whole.events) == flat(events)
    assert (batch.ts, batch.dp_rank) == (5.0, None)
    assert slices >= 60_000 // SLICE_BLOCKS
    assert all(len(e.block_hashes) <= SLICE_BLOCKS for e in batch.events)
    # No call built values from more than a slice's worth of bytes: ~1 ms each here, where the
    # one call of a whole decode took the whole frame.
    assert value_decodes and max(value_decodes) < 1 << 20 < len(payload)
    # Ids held out of the collector's way (kv_frames.py says why), read as the lists were.
    assert not isinstance(batch.events[0].token_ids, list)
    assert list(batch.events[0].token_ids[:3]) == whole.events[0].token_ids[:3]


def test_our_publishers_array_layout_and_other_events_slice_alike():
    from kvscope.app.serve.kv_events import event_structs

    s = event_structs("array")
    hashes = list(range(1, 30_001))
    tokens = [1000 + i for i in range(30_000 * BS)]
    big = s["BlockStored"](
        block_hashes=hashes,
        parent_block_hash=None,
        token_ids=tokens,
        block_size=BS,
        lora_id=None,
        medium="GPU",
        lora_name="adapter",
        group_idx=2,
    )
    events = [
        s["AllBlocksCleared"](),
        big,
        s["BlockRemoved"](block_hashes=hashes, medium="GPU", group_idx=2),
        s["BlockStored"](
            block_hashes=[2**64 - 1],
            parent_block_hash=5,
            token_ids=[1, 2, 3, 4],
            block_size=4,
            lora_id=None,
            medium="CPU",
            lora_name=None,
        ),
    ]
    payload = msgspec.msgpack.encode(s["KVEventBatch"](ts=3.0, events=events, data_parallel_rank=1))
    batch, _ = sliced(payload)
    whole = decode_batch(payload)
    assert batch.dp_rank == 1 and type(batch.events[0]).__name__ == "AllBlocksCleared"
    stored = [e for e in batch.events if isinstance(e, BlockStored)]
    assert flat(stored) == flat([e for e in whole.events if isinstance(e, BlockStored)])
    assert {(e.group_idx, e.lora_name) for e in stored[:-1]} == {(2, "adapter")}
    removed = [
        h for e in batch.events if type(e).__name__ == "BlockRemoved" for h in e.block_hashes
    ]
    assert removed == hashes


def test_a_batch_storing_more_than_the_pool_is_refused_before_its_blocks_are_decoded(
    value_decodes,
):
    pool = 20_000
    one_event = frame(stored_events(pool + 1))
    with pytest.raises(MalformedFrame, match=r"more blocks than the replica's pool holds: "):
        sliced(one_event, max_stored=pool)
    assert max(value_decodes) < 100, "the block hashes were decoded before the count was checked"
    many = frame(stored_events(pool + 1, per_event=50))
    for decode in (lambda p, m: sliced(p, m)[0], decode_batch):
        with pytest.raises(MalformedFrame, match=r"20,001 by event 400, the pool 20,000"):
            decode(many, pool)
        assert len(flat(decode(many, pool + 1).events)) == pool + 1
    # Blocks of the CPU offload tier are another pool's.
    offload = frame(stored_events(pool + 1, medium="CPU"))
    assert len(flat(sliced(offload, pool)[0].events)) == pool + 1


@pytest.mark.parametrize("ts", [math.nan, math.inf, -math.inf])
def test_a_batch_whose_ts_is_not_finite_is_malformed(ts):
    kv = vllm_events()
    small = msgspec.msgpack.encode(kv.KVEventBatch(ts=ts, events=[kv.AllBlocksCleared()]))
    big = frame(stored_events(5000), ts=ts)
    for payload in (small, big):
        assert len(big) > SLICE_BYTES
        with pytest.raises(MalformedFrame, match="batch ts must be a finite number"):
            sliced(payload)
        with pytest.raises(MalformedFrame, match="batch ts must be a finite number"):
            decode_batch(payload)


@pytest.mark.parametrize(
    "payload, reason",
    [
        (
            msgspec.msgpack.encode([1.0, {"x": b"y" * SLICE_BYTES}]),
            "events must be a list, got dict",
        ),
        (msgspec.msgpack.encode([b"x" * SLICE_BYTES]), "a batch is"),
        (msgspec.msgpack.encode([b"x" * SLICE_BYTES, []]), "batch ts takes"),
        (msgspec.msgpack.encode([1.0, [["BlockRemoved", "x" * SLICE_BYTES]]]), "block_hashes"),
        (msgspec.msgpack.encode([1.0, [[7, [0] * SLICE_BYTES]]]), "starts with its tag"),
        (
            msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, "t" * SLICE_BYTES, 4]]]),
            "token_ids: expected an array, got str",
        ),
        (
            msgspec.msgpack.encode([1.0, [["BlockStored", ["hh"] * 99_000, None, [1] * 4, 4]]]),
            "block_hashes must be a list of ints or bytes",
        ),
        (msgspec.msgpack.encode({"ts": 1.0, "events": "x" * SLICE_BYTES}), "an events list"),
        (msgspec.msgpack.encode([1.0, []]) + b"\x00" * SLICE_BYTES, "not msgpack"),
    ],
)
def test_malformed_big_payloads_name_the_problem(payload, reason):
    assert len(payload) > SLICE_BYTES
    with pytest.raises(MalformedFrame, match=reason):
        sliced(payload)


def test_a_map_encoded_big_batch_is_read_too():
    events = [["BlockStored", list(range(1, 20_001)), None, [7] * (20_000 * BS), BS, None, None]]
    batch, _ = sliced(msgspec.msgpack.encode({"ts": 2.0, "events": events}))
    assert batch.ts == 2.0 and len(flat(batch.events)) == 20_000


def test_array_pieces_find_every_boundary_whatever_the_element_sizes(monkeypatch):
    # Mixed widths of ints, then bins 1,000 times the mean: the window grows to hold them.
    items = [5, 300, 70_000, -3, 2**40, None, 1.5] * 3000 + [b"x" * 200_000] * 3 + [1] * 50
    data = msgspec.msgpack.encode(items)
    calls: list[int] = []
    monkeypatch.setattr(
        msgpack_pieces, "_tuple", Recording(msgpack_pieces._tuple, calls), raising=True
    )
    got = list(array_pieces(data, 1000))
    assert [x for piece in got for x in piece] == items
    assert [len(p) for p in got] == [1000] * 21 + [53] and len(calls) == 22
    assert list(array_pieces(msgspec.msgpack.encode([]), 10)) == []
    # msgspec words its errors otherwise: the rest is decoded in one call, rightly.
    monkeypatch.setattr(msgpack_pieces, "_TRAILING", re.compile("words no msgspec uses"))
    assert [x for piece in array_pieces(data, 1000) for x in piece] == items


@pytest.mark.parametrize(
    "data, reason",
    [
        (msgspec.msgpack.encode({"a": 1}), "expected an array, got dict"),
        (b"\xdd\x00\x00\x01\x00" + b"\x01" * 255, "truncated"),
        (msgspec.msgpack.encode([1, 2, 3]) + b"\x01", "1 bytes after the array"),
        (b"\x93\x01\xc1\x02", "malformed"),
    ],
)
def test_array_pieces_refuse_what_is_not_one_array(data, reason):
    with pytest.raises(NotMsgpack, match=reason):
        list(array_pieces(data, 2))


def test_a_stream_told_to_stop_drops_the_frame_it_is_decoding():
    got: list = []
    stream = KVStream("tcp://x:1", lambda seq, b: got.append(seq), None, replay=False)
    payload = frame(stored_events(20_000))
    stream.stopping = lambda: True
    stream.on_live([b"", (0).to_bytes(8, "big"), payload])
    assert got == []
    stream.stopping = lambda: False
    stream.on_live([b"", (1).to_bytes(8, "big"), payload])
    assert got == [1] and stream.status().malformed == 0
