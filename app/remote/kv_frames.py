"""A KV event payload decoded a slice at a time, so that a big one never stops the other threads.

msgspec decodes in one C call that holds the GIL: a 54 MB frame (600,000 blocks; the frame
cap is 64 MiB) held it for seconds, and the remote view's GUI thread froze that long. Here a
payload up to SLICE_BYTES is decoded whole (kv_wire.decode_batch); a bigger one is skimmed into
its events undecoded (`msgspec.Raw`: one pass that builds no values, ~30 ms for 64 MiB here),
each event up to SLICE_BYTES is decoded by one call, and a bigger event is read field by field,
its block hashes and token ids SLICE_BLOCKS blocks' worth at a time (app/remote/msgpack_pieces.py)
and handed on as events of SLICE_BLOCKS blocks, each chained to the one before by its parent
hash, which the remote cache applies exactly as it would the one big event. `decoding` yields
between slices (the subscriber gives up a frame there when it is stopped); between them the
GIL goes to whichever thread waits for it, the GUI's included.

The checks are kv_wire's, the same for either path; a big event's blocks count against the
replica's pool before any of them is decoded. A big payload's events hold their token ids in
arrays of int64 (`array("q")`) and their block hashes in tuples, not in lists: 600,000 blocks'
ids in lists made every full collection of the garbage collector walk 10 million references
while the batch was applied (~350 ms a collection, holding the GIL, on whichever thread
allocated). An array is no container the collector walks, and costs 8 bytes an id instead of
~40; the collector stops tracking a tuple of plain values (hashes) at the first collection that
sees it."""

from __future__ import annotations

from array import array
from collections.abc import Generator, Iterator
from dataclasses import replace
from typing import Any

import msgspec

from kvscope.app.remote.kv_wire import (
    SCALAR_FIELDS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
    Ids,
    MalformedFrame,
    StoredBlocks,
    batch_dp_rank,
    batch_ts,
    checked_hashes,
    checked_tokens,
    decode_batch,
    event_fields,
    read_event,
    tagged,
)
from kvscope.app.remote.msgpack_pieces import NotMsgpack, array_header, array_pieces, kind_of

# A payload or event up to this size is decoded by one msgspec call (~1 ms here).
SLICE_BYTES = 1 << 18
SLICE_BLOCKS = 4096  # blocks of a big event decoded at a time, and handed on as one event
_NIL = msgspec.Raw(b"\xc0")
_decoder = msgspec.msgpack.Decoder()


class _ArrayFrame(msgspec.Struct, array_like=True):
    ts: msgspec.Raw
    events: list[msgspec.Raw]
    data_parallel_rank: msgspec.Raw = _NIL


class _MapFrame(msgspec.Struct):
    ts: msgspec.Raw = _NIL
    events: msgspec.Raw = _NIL
    data_parallel_rank: msgspec.Raw = _NIL


_array_frame = msgspec.msgpack.Decoder(_ArrayFrame)
_map_frame = msgspec.msgpack.Decoder(_MapFrame)
_raw_list = msgspec.msgpack.Decoder(list[msgspec.Raw])
_raw_map = msgspec.msgpack.Decoder(dict[str, msgspec.Raw])


def decoding(payload: bytes, max_stored: int | None = None) -> Generator[None, None, EventBatch]:
    """kv_wire.decode_batch, a slice at a time: yields after every SLICE_BYTES of events (or
    SLICE_BLOCKS blocks of a big event) decoded, and returns the batch; raises MalformedFrame."""
    if len(payload) <= SLICE_BYTES:
        return decode_batch(payload, max_stored)
    ts, raws, dp_rank = _frame(payload)
    stored = StoredBlocks(max_stored)
    events: list[Event] = []
    done = 0
    for index, raw in enumerate(raws):
        if len(raw) > SLICE_BYTES:
            for event in _big_event(raw, index, stored):
                events.append(event)
                yield
            continue
        event = _untracked(read_event(_generic(raw), index))
        stored.add(event, index)
        events.append(event)
        done += len(raw)
        if done >= SLICE_BYTES:
            done = 0
            yield
    return EventBatch(ts=ts, events=events, dp_rank=dp_rank)


def _frame(payload: bytes) -> tuple[float, list[msgspec.Raw], int | None]:
    """A batch's ts, its events undecoded, and its dp rank."""
    frame: _ArrayFrame | _MapFrame
    try:
        frame = _array_frame.decode(payload)
        raws = frame.events
    except msgspec.ValidationError:  # not [ts, [event, ...], ...]: a map-encoded batch, or none
        kind = kind_of(payload)
        if kind == "list" and len(parts := _raw_list.decode(payload)) >= 2:
            raise MalformedFrame(f"batch events must be a list, got {kind_of(parts[1])}") from None
        if kind != "dict":
            raise MalformedFrame(f"a batch is [ts, events, ...], got {kind}") from None
        try:
            frame = _map_frame.decode(payload)
            raws = _raw_list.decode(frame.events)
        except msgspec.ValidationError:
            raise MalformedFrame("a map-encoded batch needs an events list") from None
    except msgspec.DecodeError as e:
        raise MalformedFrame(f"not msgpack: {e}") from None
    ts = batch_ts(_generic(frame.ts, "batch ts"))
    return ts, raws, batch_dp_rank(_generic(frame.data_parallel_rank, "data_parallel_rank"))


def _generic(raw: msgspec.Raw, what: str = "") -> Any:
    """A value decoded in one call: an event up to SLICE_BYTES, or a small field (`what`)."""
    if what and len(raw) > SLICE_BYTES:
        raise MalformedFrame(f"{what} takes {len(raw):,} bytes")
    try:
        return _decoder.decode(raw)
    except msgspec.DecodeError as e:
        raise MalformedFrame(f"not msgpack: {e}") from None


def _untracked(event: Event) -> Event:
    """An event as a big payload's are held (the module's docstring says why)."""
    if isinstance(event, BlockStored):
        hashes, tokens = tuple(event.block_hashes), _ids(event.token_ids)
        return replace(event, block_hashes=hashes, token_ids=tokens)
    if isinstance(event, BlockRemoved):
        return replace(event, block_hashes=tuple(event.block_hashes))
    return event


def _big_event(raw: msgspec.Raw, index: int, stored: StoredBlocks) -> Iterator[Event]:
    """An event bigger than SLICE_BYTES, as events of SLICE_BLOCKS blocks at most."""
    kind = kind_of(raw)
    values: dict[str, Any]
    try:
        if kind == "list":
            parts: list[Any] = _raw_list.decode(raw)
            if parts:
                parts[0] = _generic(parts[0], f"event {index}: its tag")
            tag, values = tagged(parts, index)
        elif kind == "dict":
            values = _raw_map.decode(raw)
            if "type" in values:
                values["type"] = _generic(values["type"], f"event {index}: its type")
            tag, values = tagged(values, index)
        else:
            raise MalformedFrame(f"event {index}: expected an array or map, got {kind}")
    except msgspec.ValidationError:
        raise MalformedFrame(f"event {index}: a map event's keys must be strings") from None
    if tag == "AllBlocksCleared":
        yield AllBlocksCleared()
        return
    where = f"event {index} ({tag})"
    small = {k: _generic(v, f"{where}: {k}") for k, v in values.items() if k in SCALAR_FIELDS}
    fields = event_fields(small, index, tag)
    head = array_header(values["block_hashes"])
    if head is None:
        raise MalformedFrame(f"{where}: block_hashes must be a list of ints or bytes")
    if tag == "BlockStored":
        stored.count(head[0], fields.medium, index)  # before any of them is decoded
    pieces = _pieces(values["block_hashes"], SLICE_BLOCKS, where, "block_hashes")
    if tag == "BlockRemoved":
        for piece in pieces:
            hashes = checked_hashes(piece, index, tag)
            yield BlockRemoved(block_hashes=hashes, group_idx=fields.group, medium=fields.medium)
        return
    tokens = _pieces(values["token_ids"], SLICE_BLOCKS * fields.block_size, where, "token_ids")
    parent = fields.parent
    for piece in pieces:
        hashes = checked_hashes(piece, index, tag)
        ids = _ids(checked_tokens(next(tokens, ()), index, tag))
        yield fields.stored(hashes, ids, parent)
        parent = hashes[-1] if hashes else parent
    for rest in tokens:  # ids past the last block's: checked as a small event's are, not kept
        checked_tokens(rest, index, tag)


def _ids(tokens: Ids) -> Ids:
    try:
        return array("q", tokens)
    except OverflowError:  # an id past int64 (a peer's odd value): kept as sent
        return tuple(tokens)


def _pieces(raw: msgspec.Raw, per: int, where: str, name: str) -> Iterator[tuple[Any, ...]]:
    try:
        yield from array_pieces(raw, per)
    except NotMsgpack as e:
        raise MalformedFrame(f"{where}: {name}: {e}") from None
