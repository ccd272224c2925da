"""TraceLog: the engine's always-on record of its traffic, bounded, and written while recording.

The engine calls `on_request`, `on_step` and `on_finish`: a request's ids are copied once into
int32 arrays (4 bytes a token), a step costs ~4 µs for 8 decodes (measured; a step of the bundled
model takes 10-20 ms on a CPU), so it stays on. The ring keeps the most recent `max_requests`
requests, `max_tokens` token ids and `max_steps` steps: when it drops the oldest, the trace no
longer starts on an empty pool (`trimmed`), and a replay says so. While a session file is being
recorded, every record is also written to it.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from kvscope.engine.kv.events import KVEvent
from kvscope.engine.trace.records import (
    PoolCounts,
    StepShape,
    TracedFinish,
    TracedRequest,
    TracedStep,
    TraceSettings,
)

if TYPE_CHECKING:
    from kvscope.engine.sequence import Request

MAX_REQUESTS = 4096
MAX_STEPS = 50_000  # ~10 MB of steps; an hour of a busy chat on a CPU is ~20,000
MAX_TOKENS = 4_000_000  # prompt and output ids held (16 MB as int32): ~500 chats of 8k tokens


@dataclass(frozen=True)
class Trace:
    """A session's traffic: what `engine.whatif.simulate` replays."""

    settings: TraceSettings
    requests: tuple[TracedRequest, ...]  # in arrival order
    finishes: dict[str, TracedFinish]  # by request id; a request absent here had not ended
    steps: tuple[TracedStep, ...]
    start_step: int  # the engine's step count when the trace began (its steps follow it)
    trimmed: bool = False  # older traffic was dropped: the pool was not empty at the start
    notes: tuple[str, ...] = field(default=())  # what the trace could not hold

    @property
    def finished_requests(self) -> tuple[TracedRequest, ...]:
        return tuple(r for r in self.requests if r.request_id in self.finishes)

    @property
    def complete(self) -> bool:
        """Every request ended and nothing was dropped: its own replay reproduces it exactly."""
        return not self.trimmed and len(self.finishes) == len(self.requests) and not self.notes


class TraceLog:
    def __init__(
        self,
        settings: TraceSettings,
        start_step: int = 0,
        max_requests: int = MAX_REQUESTS,
        max_steps: int = MAX_STEPS,
        max_tokens: int = MAX_TOKENS,
    ) -> None:
        self.settings = settings
        self.start_step = start_step
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        self.num_tokens = 0  # ids held by the requests and finishes kept
        self.requests: OrderedDict[str, TracedRequest] = OrderedDict()
        self.finishes: dict[str, TracedFinish] = {}
        self.steps: deque[TracedStep] = deque(maxlen=max_steps)
        self.trimmed = False
        self.notes: list[str] = []
        self.writer: Callable[[KVEvent], None] | None = None  # the session file's, if recording

    # ---- what the engine reports ------------------------------------------------------------
    def on_request(self, step: int, request: Request) -> None:
        # The records take any ids and copy them into int32 arrays; their fields are typed as
        # a file holds them (tuples), which its reader checks lines against.
        record = TracedRequest(
            step,
            request.metrics.arrival_time,
            request.request_id,
            cast(tuple[int, ...], request.prompt_token_ids),
            request.params.n,
            request.params.max_tokens,
            request.params.structured_outputs is not None,
        )
        self.requests[request.request_id] = record
        self.num_tokens += len(record.prompt_token_ids)
        self._write(record)
        self._keep_bounded()

    def on_step(
        self, step: int, start: float, duration: float, shape: StepShape, counts: PoolCounts
    ) -> None:
        if len(self.steps) == self.steps.maxlen:
            self.trimmed = True
        record = TracedStep(
            step,
            start,
            duration,
            shape.prefill_tokens,
            shape.prefill_seqs,
            shape.decode_seqs,
            shape.context_tokens,
            counts.blocks_used,
            counts.blocks_cached,
            counts.running,
            counts.waiting,
            counts.preemptions,
            counts.prefix_hit_tokens,
        )
        self.steps.append(record)
        self._write(record)

    def on_finish(self, step: int, request: Request) -> None:
        record = TracedFinish(
            step,
            request.metrics.finished_time or time.time(),
            request.request_id,
            tuple(cast(tuple[int, ...], s.output_token_ids) for s in request.sequences),
            tuple(s.finish_reason for s in request.sequences),
            request.first_scheduled_step,
            request.first_token_step,
        )
        if request.request_id in self.requests:
            self.finishes[request.request_id] = record
            self.num_tokens += record.num_tokens
        self._write(record)
        self._keep_bounded()

    def note(self, what: str) -> None:
        """Work the trace cannot replay (a beam search): a replay of it is not exact."""
        if what not in self.notes:
            self.notes.append(what)

    # ---- what a replay takes ----------------------------------------------------------------
    def trace(self) -> Trace:
        """A copy of the trace as it stands, safe to hand to another thread. Trimmed, it starts
        at the oldest request it still holds, and keeps the steps from there on."""
        requests = list(self.requests.values())
        steps = list(self.steps)
        start = self.start_step
        if self.trimmed:
            if steps:
                requests = [r for r in requests if r.step + 1 >= steps[0].step]
            if requests:
                start = min(r.step for r in requests)
                steps = [s for s in steps if s.step > start]
            elif steps:
                start = steps[0].step - 1
        ids = {r.request_id for r in requests}
        return Trace(
            self.settings,
            tuple(requests),
            {i: f for i, f in self.finishes.items() if i in ids},
            tuple(steps),
            start,
            self.trimmed,
            tuple(self.notes),
        )

    def _keep_bounded(self) -> None:
        while (
            len(self.requests) > self.max_requests or self.num_tokens > self.max_tokens
        ) and self._drop_oldest():
            pass

    def _drop_oldest(self) -> bool:
        """Drop the oldest finished request; False when every kept request is still running."""
        for request_id in self.requests:
            if request_id in self.finishes:
                dropped = self.requests.pop(request_id)
                self.num_tokens -= len(dropped.prompt_token_ids)
                self.num_tokens -= self.finishes.pop(request_id).num_tokens
                self.trimmed = True
                return True
        return False

    def _write(self, record: KVEvent) -> None:
        if self.writer is not None:
            self.writer(record)
