"""The allocator's event stream: every change to the KV pool, in order, with step and time.

The block manager and the scheduler emit; observers (the pool telemetry behind KVSnapshot, the
contiguous shadow, a recorder writing a session file) listen. The log itself keeps only the most
recent events, so a long session cannot grow memory without bound.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# What happened. Block-level: alloc, free, fork, cow, cache_hit, hashed, evict, reserve.
# Sequence-level: add (queued), admit, preempt, finish, progress (lengths after a step).
EVENT_KINDS = (
    "add",
    "admit",
    "alloc",
    "reserve",
    "cache_hit",
    "hashed",
    "evict",
    "cow",
    "fork",
    "free",
    "preempt",
    "finish",
    "progress",
)


@dataclass(frozen=True, slots=True)
class KVEvent:
    step: int
    time: float
    kind: str
    seq_id: int = -1
    blocks: tuple[int, ...] = ()
    index: int = -1  # logical index of blocks[0] in the sequence's table, where that matters
    data: dict = field(default_factory=dict)  # small JSON-able details (request id, lengths...)

    def to_json(self) -> str:
        return json.dumps(
            [
                self.step,
                self.time,
                self.kind,
                self.seq_id,
                list(self.blocks),
                self.index,
                self.data,
            ],
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, line: str) -> KVEvent:
        step, t, kind, seq_id, blocks, index, data = json.loads(line)
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown KV event kind {kind!r}")
        return cls(step, t, kind, seq_id, tuple(blocks), index, data)


Listener = Callable[[KVEvent], None]


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
        self,
        kind: str,
        seq_id: int = -1,
        blocks: Iterable[int] = (),
        index: int = -1,
        **data,
    ) -> None:
        event = KVEvent(self.step, time.time(), kind, seq_id, tuple(blocks), index, data)
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


class EventRecorder:
    """Writes every event of a session to a JSON-lines file: a header line, then one per event."""

    def __init__(self, path: str | Path, header: dict) -> None:
        self.path = Path(path)
        self._file = self.path.open("w", encoding="utf-8")
        self._file.write(json.dumps({"kvscope_events": 1, **header}) + "\n")

    def __call__(self, event: KVEvent) -> None:
        self._file.write(event.to_json() + "\n")

    def close(self) -> None:
        self._file.close()


def read_events(path: str | Path) -> tuple[dict, Iterator[KVEvent]]:
    """The header and the events of a file written by EventRecorder."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"KV event file {path} does not exist")
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines:
        raise ValueError(f"KV event file {path} is empty")
    header = json.loads(lines[0])
    if header.get("kvscope_events") != 1:
        raise ValueError(f"{path} is not a KVScope event file (bad header)")
    return header, (KVEvent.from_json(line) for line in lines[1:] if line)
