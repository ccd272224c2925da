"""The simulated pool at any step, as a KVSnapshot the block map draws.

A simulation kept with `keep_events` holds every KV event it caused; `PoolSeeker.at(step)`
replays them into the same telemetry the live engine's snapshots come from. Going forward it
applies only the events since the last call, or starts from a checkpoint past where it is; going
back it starts again from the nearest checkpoint before the step. Checkpoints are taken every
CHECKPOINT_STEPS steps on the way, so once a seeker has been walked to the end (the app does that
off its GUI thread) any move costs at most CHECKPOINT_STEPS steps of events.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Callable

from kvscope.engine.kv.events import KVEvent
from kvscope.engine.kv.snapshot import KVSnapshot
from kvscope.engine.kv.telemetry import PoolTelemetry
from kvscope.engine.whatif.settings import SimConfig

CHECKPOINT_STEPS = 200  # a move replays at most this many steps of events


class PoolSeeker:
    def __init__(self, config: SimConfig, events: list[KVEvent]) -> None:
        if events is None:
            raise ValueError("simulate(..., keep_events=True) keeps the events a seeker replays")
        self.config = config
        self.events = events
        # Index of the first event of each step: events of step s are [starts[s-1], starts[s]).
        self._steps = [e.step for e in events]
        self._fresh: Callable[[], PoolTelemetry] = lambda: PoolTelemetry(
            config.num_blocks, config.block_size, config.allocator, config.layout().windows
        )
        self._telemetry = self._fresh()
        self._applied = 0  # events applied to _telemetry
        self._checkpoints: dict[int, tuple[int, PoolTelemetry]] = {0: (0, self._fresh())}

    @property
    def last_step(self) -> int:
        return self._steps[-1] if self._steps else 0

    def at(self, step: int) -> KVSnapshot:
        """The pool after `step` (0: empty, before the first)."""
        step = max(0, min(step, self.last_step))
        end = bisect.bisect_right(self._steps, step)
        best = max(s for s in self._checkpoints if s <= step)
        if end < self._applied or self._checkpoints[best][0] > self._applied:
            self._restore(best)  # back, or forward past a checkpoint: start from it
        while self._applied < end:
            event = self.events[self._applied]
            self._telemetry(event)
            self._applied += 1
            done = event.step
            nxt = self._steps[self._applied] if self._applied < len(self._steps) else None
            if nxt != done and done % CHECKPOINT_STEPS == 0 and done not in self._checkpoints:
                self._checkpoints[done] = (self._applied, copy.deepcopy(self._telemetry))
        snapshot = self._telemetry.snapshot()
        return snapshot

    def _restore(self, best: int) -> None:
        applied, telemetry = self._checkpoints[best]
        self._telemetry, self._applied = copy.deepcopy(telemetry), applied
