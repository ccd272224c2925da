"""PoolObservers: the event log of one engine's pool and everything that follows it.

The snapshot telemetry (which also owns the pool's cumulative counters), the contiguous shadow
(paged pools only) and, while a session is being recorded, the recorder. The engine hands
`events` to its allocator and scheduler and reads snapshots and counters from here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from kvscope.engine.kv.events import EventLog, EventRecorder
from kvscope.engine.kv.shadow import ContiguousShadow
from kvscope.engine.kv.snapshot import KVSnapshot
from kvscope.engine.kv.telemetry import PoolCounters, PoolTelemetry

# Only a what-if simulation builds its pool without snapshots; it neither shows nor records one.
_NO_SNAPSHOTS = "this pool was built without snapshots"


class PoolObservers:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        allocator: str,
        max_seq_len: int,
        group_windows: tuple[int | None, ...] = (None,),
        with_shadow: bool = True,
        with_snapshots: bool = True,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.allocator = allocator
        self.max_seq_len = max_seq_len
        self.group_windows = group_windows
        self.events = EventLog()
        # Without snapshots (a what-if sweep) only the counters follow the events: the per-block
        # state costs a few microseconds an event, a tenth of a simulated step.
        self.telemetry: PoolTelemetry | None = None
        self._counters = PoolCounters()
        if with_snapshots:
            self.telemetry = PoolTelemetry(num_blocks, block_size, allocator, group_windows)
            self._counters = self.telemetry.counters
            self.events.subscribe(self.telemetry)
        else:
            self.events.subscribe(self._counters)
        self.shadow: ContiguousShadow | None = None
        if allocator == "paged" and with_shadow:
            self.shadow = ContiguousShadow(
                num_blocks, block_size, max_seq_len, num_groups=len(group_windows)
            )
            self.events.subscribe(self.shadow)
        self._recorder: EventRecorder | None = None

    @property
    def counters(self) -> PoolCounters:
        return self._counters

    def snapshot(self) -> KVSnapshot:
        assert self.telemetry is not None, _NO_SNAPSHOTS
        return self.telemetry.snapshot()

    def shadow_snapshot(self) -> KVSnapshot | None:
        return self.shadow.snapshot() if self.shadow is not None else None

    def start_recording(
        self, path: str | Path, model: str, extra_header: dict[str, Any] | None = None
    ) -> None:
        """Write every event from now on to a session file that `replay_events` reads back.
        The header carries what the pool holds already, so the replay starts where we are;
        `extra_header` adds entries of its own (the traffic trace's settings)."""
        self.stop_recording()
        assert self.telemetry is not None, _NO_SNAPSHOTS
        header = {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "allocator": self.allocator,
            "max_seq_len": self.max_seq_len,
            "model": model,
            "cached_blocks": self.telemetry.has_hash.nonzero()[0].tolist(),
            # Version 3: the KV groups' windows, and the group of each cached block.
            "group_windows": list(self.group_windows),
            "cached_groups": self.telemetry.group[self.telemetry.has_hash].tolist(),
            # Cumulative counters so far, so replayed metrics match the live ones exactly.
            "counters": dataclasses.asdict(self.counters),
            **(extra_header or {}),
        }
        self._recorder = EventRecorder(path, header)
        self.events.subscribe(self._recorder)

    @property
    def recorder(self) -> EventRecorder | None:
        """The session file being written, if any (other records than events join it)."""
        return self._recorder

    def stop_recording(self) -> None:
        if self._recorder is not None:
            self.events.unsubscribe(self._recorder)
            self._recorder.close()
            self._recorder = None
