"""The contiguous shadow: the live paged engine's traffic replayed onto a naive allocator.

It listens to the paged engine's events (requests added, admitted, grown, finished) and places
the same sequences on a simulated pool of the same size with max-length contiguous reservations,
without running the model. Sequences it cannot place wait in its own FIFO queue, so the app can
show side by side how much the naive scheme reserves but never fills, where its holes are, and
how many requests it would make wait that the paged engine is already serving.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

from kvscope.engine.kv.allocator import PrefixMatch
from kvscope.engine.kv.contiguous import ContiguousAllocator
from kvscope.engine.kv.events import (
    EventLog,
    KVEvent,
    SequenceAdded,
    SequenceAdmitted,
    SequenceFinished,
    SequenceForked,
    SequencePreempted,
    StepProgress,
)
from kvscope.engine.kv.snapshot import KVSnapshot
from kvscope.engine.kv.telemetry import PoolTelemetry

_NO_MATCH = PrefixMatch([], [])


class ContiguousShadow:
    def __init__(
        self, num_blocks: int, block_size: int, max_seq_len: int, num_groups: int = 1
    ) -> None:
        self.log = EventLog(capacity=1)  # the shadow's own events only feed its telemetry
        self.telemetry = PoolTelemetry(num_blocks, block_size, allocator="contiguous-shadow")
        self.log.subscribe(self.telemetry)
        # A paged pool with KV groups holds `num_groups` blocks per block_size tokens (one per
        # group); the naive scheme reserves every group for max_seq_len, so its reservation, and
        # what a sequence fills of it, count num_groups slots per token.
        self.slots_per_token = num_groups
        # A pool too small for even one reservation leaves every request waiting.
        self.bm = ContiguousAllocator(
            num_blocks,
            block_size,
            min(max_seq_len * num_groups, num_blocks * block_size),
            self.log,
        )
        self.capacity = self.bm.reservation_blocks * block_size
        self.queue: deque[int] = deque()
        self.placed: set[int] = set()
        self.live_in_paged: set[int] = set()  # running in the real engine
        self.computed: dict[int, int] = {}

    def __call__(self, event: KVEvent) -> None:
        self.log.step = event.step
        handler = self._HANDLERS.get(type(event))
        if handler is not None:  # block-level events of the paged pool mean nothing here
            handler(self, event)

    def _on_added(self, e: SequenceAdded) -> None:
        self.log.publish(e)

    def _on_admitted(self, e: SequenceAdmitted | SequenceForked) -> None:
        self.live_in_paged.add(e.seq_id)
        if e.seq_id not in self.placed and e.seq_id not in self.queue:
            self.queue.append(e.seq_id)
            self._place_waiting()

    def _on_forked(self, e: SequenceForked) -> None:
        if e.group:
            return  # one event per KV group; the first places the child
        # No sharing in the naive scheme: a forked sample needs its own reservation.
        self.computed[e.seq_id] = self.computed.get(e.parent, 0)
        self._on_admitted(e)

    def _on_preempted(self, e: SequencePreempted) -> None:
        self.live_in_paged.discard(e.seq_id)

    def _on_progress(self, e: StepProgress) -> None:
        lens = []
        for seq_id, num_tokens, num_computed in e.lens:
            # A preempted-and-recomputed sequence never lost its K/V here: keep the maximum.
            computed = max(num_computed * self.slots_per_token, self.computed.get(seq_id, 0))
            computed = min(computed, self.capacity)  # an observer must never fail a step
            self.computed[seq_id] = computed
            if seq_id in self.placed:
                self.bm.grow(seq_id, computed)
                lens.append((seq_id, num_tokens, computed))
            else:
                lens.append((seq_id, num_tokens, 0))
        self.log.emit(StepProgress, lens=tuple(lens))

    def _on_finished(self, e: SequenceFinished) -> None:
        self.live_in_paged.discard(e.seq_id)
        self.computed.pop(e.seq_id, None)
        if e.seq_id in self.placed:
            self.placed.discard(e.seq_id)
            self.bm.free(e.seq_id)
        elif e.seq_id in self.queue:
            self.queue.remove(e.seq_id)
        self.log.publish(e)
        self._place_waiting()

    def _place_waiting(self) -> None:
        # Strict FIFO, like the engine's own admission: the head blocks those behind it.
        while self.queue and self.bm.can_adopt(_NO_MATCH, 0):
            seq_id = self.queue.popleft()
            self.bm.adopt(seq_id, _NO_MATCH)
            self.placed.add(seq_id)
            computed = self.computed.get(seq_id, 0)
            self.log.emit(SequenceAdmitted, seq_id=seq_id, query_tokens=0, hit_tokens=0, first=True)
            if computed:
                self.bm.grow(seq_id, computed)

    _HANDLERS: ClassVar[dict[type[KVEvent], Callable[[ContiguousShadow, Any], None]]] = {
        SequenceAdded: _on_added,
        SequenceAdmitted: _on_admitted,
        SequenceForked: _on_forked,
        SequencePreempted: _on_preempted,
        StepProgress: _on_progress,
        SequenceFinished: _on_finished,
    }

    @property
    def num_would_wait(self) -> int:
        """Sequences the paged engine is running that the naive allocator could not place."""
        return sum(s in self.live_in_paged for s in self.queue)

    def snapshot(self) -> KVSnapshot:
        snap = self.telemetry.snapshot()
        metrics = dataclasses.replace(snap.metrics, num_would_wait=self.num_would_wait)
        return dataclasses.replace(snap, metrics=metrics)
