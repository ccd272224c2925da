"""TelemetryFeed: what the GUI draws of the engine, taken on the worker's thread.

At most every TELEMETRY_INTERVAL_S, and only when the pool changed, it takes `kv_snapshot()`,
`shadow_snapshot()` and `stats()`; device memory is read every DEVICE_MEMORY_INTERVAL_S. They go
out together as one `Telemetry` (immutable copies: the GUI never reads engine state).
"""

from __future__ import annotations

import time

from kvscope.app.core.engine_messages import Telemetry
from kvscope.engine.kv.snapshot import KVSnapshot
from kvscope.engine.memory.device_memory import read_device_memory

TELEMETRY_INTERVAL_S = 0.1
DEVICE_MEMORY_INTERVAL_S = 0.5


class TelemetryFeed:
    def __init__(self) -> None:
        self.dirty = True  # the pool may have changed since the last snapshots
        self.last_taken = 0.0
        self._last_memory = 0.0
        self._device_memory: dict | None = None
        self._snapshots: tuple[KVSnapshot, KVSnapshot | None] | None = None

    def restart(self) -> None:
        """A new engine: nothing taken of it yet."""
        self.dirty = True
        self._snapshots = None

    def due(self) -> bool:
        return time.monotonic() - self.last_taken >= TELEMETRY_INTERVAL_S

    @property
    def paged(self) -> KVSnapshot | None:
        """The paged pool as last taken."""
        return self._snapshots[0] if self._snapshots is not None else None

    def take(self, llm) -> Telemetry | None:
        """This moment's telemetry, or None when neither the pool nor the memory reading is
        due to change."""
        now = time.monotonic()
        memory_due = now - self._last_memory >= DEVICE_MEMORY_INTERVAL_S
        if not (self.dirty or memory_due):
            return None
        if memory_due:
            self._last_memory = now
            self._device_memory = read_device_memory().to_dict()
        if self.dirty or self._snapshots is None:
            engine = llm.engine
            self._snapshots = (engine.kv_snapshot(), engine.shadow_snapshot())
            self.dirty = False
        self.last_taken = now
        paged, shadow = self._snapshots
        return Telemetry(paged, shadow, llm.stats(), self._device_memory)
