"""The allocator's event stream: every change to the KV pool, in order, as typed, frozen records.

The block manager and the scheduler emit; observers (the pool telemetry behind KVSnapshot, the
contiguous shadow, a recorder writing a session file) listen and dispatch on the event's class,
so a misspelt kind is an import error, never a run-time surprise. The log stamps every event with
the engine step it belongs to and the wall time, and keeps only the most recent ones, so a long
session cannot grow memory without bound.

Session file format, version 4 (`FORMAT_VERSION`; versions 2 and 3 still read): UTF-8 JSON lines.

- Line 1, the header: an object `{"kvscope_events": 2, "num_blocks": int, "block_size": int,
  "allocator": "paged" | "contiguous", "max_seq_len": int, "model": str, "cached_blocks":
  [block ids holding a cached prefix when recording began], "counters": {cumulative
  PoolCounters fields so far}}`.
- Every further line, one event: `{"kind": tag, "step": int, "time": float, ...}` whose other
  keys are exactly the fields of the tag's class below. Lists stand for tuples; every int is >= 0.

  kind                fields (besides step, time)            meaning
  sequence_added      seq_id, request_id: str, sample,       a sample exists; it waits
                      num_prompt_tokens
  sequence_admitted   seq_id, query_tokens, hit_tokens,      running; hit_tokens came from
                      first: bool                            the prefix cache
  blocks_reserved     seq_id, blocks                         a contiguous reservation
  blocks_allocated    seq_id, blocks, start, group           table[start:] = blocks
  prefix_cache_hit    seq_id, blocks, group, start           table[start:] = cached blocks
  blocks_hashed       seq_id, blocks                         they now hold a cached prefix
  block_evicted       block                                  its cached prefix was dropped
  block_copied        seq_id, index, src, dst, group         copy-on-write of table[index]
  sequence_forked     seq_id, parent, blocks, group, start   the child shares the parent's
  blocks_freed        seq_id, blocks, group, start           the table was dropped
  blocks_released     seq_id, blocks, start, group           a sliding group's blocks out of
                                                             the window went back (v3)
  sequence_preempted  seq_id                                 blocks taken back; waits again
  sequence_finished   seq_id, reason: str | null             done or aborted
  step_progress       lens: [[seq_id, num_tokens,            end of a step: how far each
                      num_computed_tokens], ...]             sequence got

Version 4 interleaves the traffic trace's lines (`engine.trace`: kinds `trace_request`,
`trace_finish`, `trace_step`), which `read_events` passes over and `engine.trace.read_trace`
reads; a version 3 file has none and replays as before.

`read_events` checks the version and every line: a JSON object of a known kind with exactly its
fields, each of its type (ints below 2**63, lines up to 64 MiB, the header 256 MiB); anything
else is a ValueError naming the line and the problem. `engine.kv.replay` checks the rest:
block ids and groups against the header, frees against what each sequence holds.
`group` names a KV group (`engine.kv.layout`; always 0 for a model whose layers attend alike);
`start` the first logical block an event's `blocks` stand for (a sliding group's table holds
nothing before its window). In version 2 files both are absent and 0.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Concatenate, ParamSpec, TypeVar, get_type_hints

from kvscope.engine.input_file import open_input_file
from kvscope.engine.kv.session_json import (
    MAX_HEADER_BYTES,
    SNIFF_BYTES,
    decode_field,
    decode_line,
    load_json,
    numbered_lines,
    shown,
)

FORMAT_VERSION = 4
# Version 2 files (before KV groups) read the same: their events lack the fields that have a
# default (group, start), which then take it. Version 4 adds the traffic trace's lines (kinds
# starting "trace_", engine/trace) and a "trace" header entry; version 3 files have neither.
READABLE_VERSIONS = (2, 3, 4)
TRACE_KIND_PREFIX = "trace_"


@dataclass(frozen=True, slots=True)
class KVEvent:
    """What every event carries: the engine step it belongs to and its wall time."""

    kind: ClassVar[str]
    step: int
    time: float


@dataclass(frozen=True, slots=True)
class SequenceAdded(KVEvent):
    kind: ClassVar[str] = "sequence_added"
    seq_id: int
    request_id: str
    sample: int  # index within its request (n > 1)
    num_prompt_tokens: int


@dataclass(frozen=True, slots=True)
class SequenceAdmitted(KVEvent):
    kind: ClassVar[str] = "sequence_admitted"
    seq_id: int
    query_tokens: int  # tokens looked up in the prefix cache
    hit_tokens: int  # of which served from it
    first: bool  # first admission (not a re-admission after preemption)


@dataclass(frozen=True, slots=True)
class BlocksReserved(KVEvent):
    kind: ClassVar[str] = "blocks_reserved"
    seq_id: int
    blocks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BlocksAllocated(KVEvent):
    kind: ClassVar[str] = "blocks_allocated"
    seq_id: int
    blocks: tuple[int, ...]
    start: int  # logical index of blocks[0] in the sequence's table
    group: int = 0  # the KV group whose table this is (engine.kv.layout); absent in version 2


@dataclass(frozen=True, slots=True)
class PrefixCacheHit(KVEvent):
    kind: ClassVar[str] = "prefix_cache_hit"
    seq_id: int
    blocks: tuple[int, ...]  # the sequence's table from `start` on
    group: int = 0
    start: int = 0  # a sliding group needs only the blocks under its window: none before


@dataclass(frozen=True, slots=True)
class BlocksHashed(KVEvent):
    kind: ClassVar[str] = "blocks_hashed"
    seq_id: int
    blocks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BlockEvicted(KVEvent):
    kind: ClassVar[str] = "block_evicted"
    block: int


@dataclass(frozen=True, slots=True)
class BlockCopiedOnWrite(KVEvent):
    kind: ClassVar[str] = "block_copied"
    seq_id: int
    index: int  # logical index in the sequence's table
    src: int
    dst: int
    group: int = 0


@dataclass(frozen=True, slots=True)
class SequenceForked(KVEvent):
    kind: ClassVar[str] = "sequence_forked"
    seq_id: int  # the child
    parent: int
    blocks: tuple[int, ...]  # the parent's table from `start` on (one event per group)
    group: int = 0
    start: int = 0


@dataclass(frozen=True, slots=True)
class BlocksFreed(KVEvent):
    kind: ClassVar[str] = "blocks_freed"
    seq_id: int
    blocks: tuple[int, ...]  # the table from `start` on (what it still held)
    group: int = 0
    start: int = 0


@dataclass(frozen=True, slots=True)
class BlocksReleased(KVEvent):
    """A sliding group's blocks that fell wholly out of the window of the sequence's next
    token: table[start:start + len(blocks)] are given back while the sequence runs on."""

    kind: ClassVar[str] = "blocks_released"
    seq_id: int
    blocks: tuple[int, ...]
    start: int
    group: int


@dataclass(frozen=True, slots=True)
class SequencePreempted(KVEvent):
    kind: ClassVar[str] = "sequence_preempted"
    seq_id: int


@dataclass(frozen=True, slots=True)
class SequenceFinished(KVEvent):
    kind: ClassVar[str] = "sequence_finished"
    seq_id: int
    reason: str | None


@dataclass(frozen=True, slots=True)
class StepProgress(KVEvent):
    kind: ClassVar[str] = "step_progress"
    lens: tuple[tuple[int, int, int], ...]  # (seq_id, num_tokens, num_computed_tokens)


EVENT_TYPES: dict[str, type[KVEvent]] = {
    cls.kind: cls
    for cls in (
        SequenceAdded,
        SequenceAdmitted,
        BlocksReserved,
        BlocksAllocated,
        PrefixCacheHit,
        BlocksHashed,
        BlockEvicted,
        BlockCopiedOnWrite,
        SequenceForked,
        BlocksFreed,
        BlocksReleased,
        SequencePreempted,
        SequenceFinished,
        StepProgress,
    )
}

Listener = Callable[[KVEvent], None]
P = ParamSpec("P")
E = TypeVar("E", bound=KVEvent)


class EventLog:
    """Bounded, in-order log of KV events, fanned out to listeners as they happen."""

    # Progress events carry one entry per running sequence, so keep the window modest.
    def __init__(self, capacity: int = 10_000) -> None:
        if capacity < 1:
            raise ValueError(f"event log capacity must be >= 1, got {capacity}")
        self.events: deque[KVEvent] = deque(maxlen=capacity)
        self.listeners: list[Listener] = []
        self.step = 0
        self.total = 0  # events ever emitted, including those the bounded log has dropped

    def emit(
        self, kind: Callable[Concatenate[int, float, P], E], *args: P.args, **kwargs: P.kwargs
    ) -> E:
        """Build a `kind` event of the current step, stamped now, and publish it."""
        event = kind(self.step, time.time(), *args, **kwargs)
        self.publish(event)
        return event

    def publish(self, event: KVEvent) -> None:
        """Log and fan out an event as it is (an observer forwarding another log's event)."""
        self.events.append(event)
        self.total += 1
        for listener in self.listeners:
            listener(event)

    def subscribe(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        self.listeners.remove(listener)

    def recent(self, n: int | None = None) -> list[KVEvent]:
        events = list(self.events)
        return events if n is None else events[-n:]


# ---- the session file --------------------------------------------------------------------------
def event_to_json(event: KVEvent) -> str:
    record = {"kind": event.kind, **{f.name: getattr(event, f.name) for f in fields(event)}}
    # A trace record holds its token ids as compact arrays (engine/trace/records.py).
    return json.dumps(record, separators=(",", ":"), default=list)


@functools.cache
def _field_types(cls: type[KVEvent]) -> dict[str, Any]:
    """Field name -> type of a kind, resolved once."""
    return {f.name: get_type_hints(cls)[f.name] for f in fields(cls)}


@functools.cache
def _defaulted(cls: type[KVEvent]) -> frozenset[str]:
    """Fields a line may leave out (they came with format version 3 and have a default)."""
    return frozenset(f.name for f in fields(cls) if f.default is not MISSING)


def is_trace_line(record: object) -> bool:
    """A version-4 traffic trace line (engine.trace), which the KV replay passes over."""
    return isinstance(record, dict) and str(record.get("kind", "")).startswith(TRACE_KIND_PREFIX)


def event_from_json(
    line: str | dict[str, Any], kinds: dict[str, type[KVEvent]] = EVENT_TYPES
) -> KVEvent:
    """Parse one event line (or its decoded JSON) into one of `kinds`; ValueError says what is
    wrong with it."""
    record = load_json(line) if isinstance(line, str) else line
    if not isinstance(record, dict):
        raise ValueError(f"an event is a JSON object, got {type(record).__name__}")
    record = dict(record)  # the caller's stays whole
    kind = record.pop("kind", None)
    cls = kinds.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown KV event kind {shown(kind)}")
    # A class is hashable; mypy reads its instances' __hash__ as the class's (python/mypy#11470)
    types_ = _field_types(cls)  # type: ignore[arg-type]
    missing = types_.keys() - record.keys() - _defaulted(cls)  # type: ignore[arg-type]
    extra = record.keys() - types_.keys()
    if missing:
        raise ValueError(f"{kind} event lacks fields {shown(sorted(missing))}")
    if extra:
        raise ValueError(f"{kind} event has unknown fields {shown(sorted(extra))}")
    values = {
        name: decode_field(record[name], hint, f"{kind}.{name}")
        for name, hint in types_.items()
        if name in record
    }
    return cls(**values)


class EventRecorder:
    """Writes every event of a session to a JSON-lines file: a header line, then one per event."""

    def __init__(self, path: str | Path, header: dict[str, Any]) -> None:
        self.path = Path(path)
        self._file = self.path.open("w", encoding="utf-8")
        self._file.write(json.dumps({"kvscope_events": FORMAT_VERSION, **header}) + "\n")

    def __call__(self, event: KVEvent) -> None:
        self._file.write(event_to_json(event) + "\n")

    def close(self) -> None:
        self._file.close()


def read_events(path: str | Path) -> tuple[dict[str, Any], Iterator[KVEvent]]:
    """The header and the events of a file written by EventRecorder (events read and parsed
    lazily, a line at a time)."""
    header, numbered = read_numbered_events(path)
    return header, (event for _, event in numbered)


def read_numbered_events(
    path: str | Path,
) -> tuple[dict[str, Any], Iterator[tuple[int, KVEvent]]]:
    """`read_events`, each event with its line number (for messages that name the line)."""
    path = Path(path)
    with open_input_file(path, "KV event file") as f:
        # A header is a JSON object: a file that does not start like one (a 1 GB file of NUL
        # bytes) is refused from its first bytes, not after a 256 MiB line has been read.
        first = f.readline(SNIFF_BYTES)
        if b"\0" in first or (len(first) == SNIFF_BYTES and first.lstrip()[:1] != b"{"):
            raise ValueError(
                f"{path}:1: not a KVScope event file (bad header: its first bytes are no JSON)"
            )
        if len(first) == SNIFF_BYTES and not first.endswith(b"\n"):
            first += f.readline(MAX_HEADER_BYTES + 1 - len(first))
    if not first:
        raise ValueError(f"KV event file {path} is empty")
    try:
        header = load_json(decode_line(path, 1, first, MAX_HEADER_BYTES))
    except ValueError as e:
        raise ValueError(f"{path}:1: not a KVScope event file (bad header): {e}") from None
    if not isinstance(header, dict) or "kvscope_events" not in header:
        raise ValueError(f"{path}:1: not a KVScope event file (bad header)")
    if header["kvscope_events"] not in READABLE_VERSIONS:
        raise ValueError(
            f"{path}:1: event format version {shown(header['kvscope_events'])}; "
            f"this KVScope reads version {' or '.join(map(str, READABLE_VERSIONS))}"
        )
    return header, _parse_lines(path)


def _parse_lines(path: Path) -> Iterator[tuple[int, KVEvent]]:
    for number, line in numbered_lines(path):
        try:
            record = load_json(line)
            if not is_trace_line(record):
                event = event_from_json(record)
                if not math.isfinite(event.time):  # the trace's reader checks its own lines
                    raise ValueError(f"{event.kind}.time is {event.time!r}; it must be finite")
                yield number, event
        except ValueError as e:  # json.JSONDecodeError is one too
            raise ValueError(f"{path}:{number}: {e}") from None
