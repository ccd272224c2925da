"""Decode one KV event payload as vLLM publishes it, into plain frozen dataclasses.

vLLM's schema (vllm/distributed/kv_events.py; our publisher app/serve/kv_events.py mirrors it):
a batch `[ts, events, data_parallel_rank?]` (always array-like), each event a tagged struct
`BlockStored` / `BlockRemoved` / `AllBlocksCleared` in one of two layouts:

- map (vLLM 0.33, and `kvscope serve` by default): `{"type": "BlockStored", "block_hashes": ...}`;
- array (older vLLM releases, `kvscope serve --kv-events-encoding array`):
  `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  lora_name, extra_keys?, group_idx?, ...]`, fields by position after the tag.

We decode the msgpack generically (msgspec without a type) and pick fields ourselves, so that
both layouts, unknown trailing fields (a newer vLLM appends them) and unknown map keys are
read without a schema change, and fields an older vLLM lacks take their defaults. Anything
that does not fit raises MalformedFrame with a short reason; the subscriber counts it and
carries on. tests/app/serve/test_vllm_kv_events.py feeds it batches from vLLM 0.33's own
publisher.

A batch's `ts` must be a finite number, and, when the replica's pool size is known, a batch may
not store more blocks than the pool holds: either is a MalformedFrame. `decode_batch` decodes a
payload in one msgspec call, which holds the GIL throughout; the subscriber decodes a big one a
slice at a time (app/remote/kv_frames.py), with the checks here."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec


class MalformedFrame(ValueError):
    """A payload that is not a KV event batch; the message says what was wrong."""


BlockHash = int | bytes
# Lists as decoded; a tuple, and ids in an array, where a big frame was decoded in pieces
# (kv_frames.py says why).
Hashes = Sequence[BlockHash]
Ids = Sequence[int]


@dataclass(frozen=True)
class BlockStored:
    block_hashes: Hashes
    parent_block_hash: BlockHash | None
    token_ids: Ids
    block_size: int
    group_idx: int = 0
    medium: str | None = None
    lora_name: str | None = None
    lora_id: int | None = None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: Hashes
    group_idx: int = 0
    medium: str | None = None


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class EventBatch:
    ts: float
    events: list[Event] = field(default_factory=list)
    dp_rank: int | None = None


# Positional field order after the tag, as vLLM declares them (array layout). Fields past the
# end of these lists are a newer vLLM's additions and are ignored.
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
_REQUIRED = {
    "BlockStored": ("block_hashes", "token_ids", "block_size"),
    "BlockRemoved": ("block_hashes",),
    "AllBlocksCleared": (),
}
_FIELDS = {"BlockStored": _STORED_FIELDS, "BlockRemoved": _REMOVED_FIELDS, "AllBlocksCleared": ()}
# The fields besides block_hashes and token_ids: small, whatever the event's size.
SCALAR_FIELDS = frozenset(
    ("parent_block_hash", "block_size", "lora_id", "medium", "lora_name", "group_idx")
)

_decoder = msgspec.msgpack.Decoder()
MAX_BLOCK_SIZE = 1 << 16  # vLLM's blocks hold 1..a few thousand tokens (mamba's the most)
PRIMARY_MEDIA = (None, "GPU")  # the tier of the pool a replica reports; "CPU" is vLLM's offload


def decode_batch(payload: bytes, max_stored: int | None = None) -> EventBatch:
    """One PUB payload (or replayed payload) -> EventBatch, in one msgspec call; raises
    MalformedFrame. `max_stored`: the most blocks a batch may store in the primary pool (the
    replica's num_gpu_blocks), None when not known. The subscriber decodes a big payload a
    slice at a time instead (kv_frames.decoding)."""
    try:
        raw = _decoder.decode(payload)
    except msgspec.DecodeError as e:
        raise MalformedFrame(f"not msgpack: {e}") from None
    if isinstance(raw, dict):  # tolerate a map-encoded batch too
        raw = [raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")]
    if not isinstance(raw, list) or len(raw) < 2:
        raise MalformedFrame(f"a batch is [ts, events, ...], got {type(raw).__name__}")
    events = raw[1]
    if not isinstance(events, list):
        raise MalformedFrame(f"batch events must be a list, got {type(events).__name__}")
    ts, dp_rank = batch_ts(raw[0]), batch_dp_rank(raw[2] if len(raw) > 2 else None)
    stored = StoredBlocks(max_stored)
    decoded = []
    for index, event in enumerate(events):
        decoded.append(read_event(event, index))
        stored.add(decoded[-1], index)
    return EventBatch(ts=ts, events=decoded, dp_rank=dp_rank)


def batch_ts(ts: Any) -> float:
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise MalformedFrame(f"batch ts must be a number, got {ts!r:.40}")
    if not math.isfinite(ts):
        raise MalformedFrame(f"batch ts must be a finite number, got {ts!r}")
    return float(ts)


def batch_dp_rank(dp_rank: Any) -> int | None:
    if dp_rank is not None and not _is_int(dp_rank):
        raise MalformedFrame(f"data_parallel_rank must be an int or nil, got {dp_rank!r:.40}")
    return dp_rank


class StoredBlocks:
    """The blocks a batch stores in the primary pool, against the pool's size when known: a
    step of vLLM's cannot store more blocks than its pool has."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.total = 0

    def add(self, event: Event, index: int) -> None:
        if isinstance(event, BlockStored):
            self.count(len(event.block_hashes), event.medium, index)

    def count(self, blocks: int, medium: str | None, index: int) -> None:
        if medium not in PRIMARY_MEDIA:
            return
        self.total += blocks
        if self.limit is not None and self.total > self.limit:
            raise MalformedFrame(
                f"the batch stores more blocks than the replica's pool holds: {self.total:,} "
                f"by event {index}, the pool {self.limit:,} (num_gpu_blocks)"
            )


def read_event(raw: Any, index: int) -> Event:
    """One event, decoded generically (a list or a map), checked and typed."""
    tag, values = tagged(raw, index)
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    hashes = checked_hashes(values["block_hashes"], index, tag)
    fields = event_fields(values, index, tag)
    if tag == "BlockRemoved":
        return BlockRemoved(block_hashes=hashes, group_idx=fields.group, medium=fields.medium)
    return fields.stored(hashes, checked_tokens(values["token_ids"], index, tag), fields.parent)


def tagged(raw: Any, index: int) -> tuple[str, dict[str, Any]]:
    """An event's tag and its fields by name (whatever form their values are in), checked for
    the ones its tag needs."""
    if isinstance(raw, list):
        if not raw or not isinstance(raw[0], str):
            raise MalformedFrame(f"event {index}: an array event starts with its tag")
        tag = raw[0]
        names = _FIELDS.get(tag)
        if names is None:
            raise MalformedFrame(f"event {index}: unknown event type {tag!r:.40}")
        values = dict(zip(names, raw[1:], strict=False))
    elif isinstance(raw, dict):
        found = raw.get("type")
        if not isinstance(found, str) or found not in _FIELDS:
            raise MalformedFrame(f"event {index}: unknown event type {found!r:.40}")
        tag = found
        values = raw
    else:
        raise MalformedFrame(f"event {index}: expected an array or map, got {type(raw).__name__}")
    missing = [name for name in _REQUIRED[tag] if name not in values]
    if missing:
        raise MalformedFrame(f"event {index} ({tag}): missing {', '.join(missing)}")
    return tag, values


@dataclass(frozen=True)
class EventFields:
    """An event's fields but its block hashes and token ids, checked."""

    group: int
    medium: str | None
    parent: BlockHash | None = None
    block_size: int = 1
    lora_name: str | None = None
    lora_id: int | None = None

    def stored(self, hashes: Hashes, tokens: Ids, parent: BlockHash | None) -> BlockStored:
        return BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=tokens,
            block_size=self.block_size,
            group_idx=self.group,
            medium=self.medium,
            lora_name=self.lora_name,
            lora_id=self.lora_id,
        )


def event_fields(values: dict[str, Any], index: int, tag: str) -> EventFields:
    """The SCALAR_FIELDS of a BlockStored or BlockRemoved, decoded, checked."""
    group = values.get("group_idx")
    group = 0 if group is None else group
    if not _is_int(group) or group < 0:
        raise MalformedFrame(
            f"event {index} ({tag}): group_idx must be an int >= 0, got {group!r:.40}"
        )
    medium = _opt_str(values.get("medium"), "medium", index, tag)
    if tag == "BlockRemoved":
        return EventFields(group, medium)
    parent = values.get("parent_block_hash")
    if parent is not None and not _is_hash(parent):
        raise MalformedFrame(
            f"event {index} ({tag}): parent_block_hash {parent!r:.40} is not a hash"
        )
    block_size = values["block_size"]
    if not _is_int(block_size) or not 0 < block_size <= MAX_BLOCK_SIZE:
        raise MalformedFrame(
            f"event {index} ({tag}): block_size must be in 1..{MAX_BLOCK_SIZE}, "
            f"got {block_size!r:.40}"
        )
    lora_id = values.get("lora_id")
    return EventFields(
        group,
        medium,
        parent,
        block_size,
        _opt_str(values.get("lora_name"), "lora_name", index, tag),
        lora_id if _is_int(lora_id) else None,
    )


def checked_tokens(raw: Any, index: int, tag: str) -> Ids:
    if not isinstance(raw, (list, tuple)) or not all(_is_int(t) for t in raw):
        raise MalformedFrame(f"event {index} ({tag}): token_ids must be a list of ints")
    return raw


def checked_hashes(raw: Any, index: int, tag: str) -> Hashes:
    if not isinstance(raw, (list, tuple)) or not all(_is_hash(h) for h in raw):
        raise MalformedFrame(f"event {index} ({tag}): block_hashes must be a list of ints or bytes")
    return raw


def _opt_str(value: Any, name: str, index: int, tag: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise MalformedFrame(
        f"event {index} ({tag}): {name} must be a string or nil, got {value!r:.40}"
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_hash(value: Any) -> bool:
    return _is_int(value) or isinstance(value, bytes)
