"""Replay a trace's requests through a SimEngine under other settings: what would have happened.

While the simulation's steps are the recording's (the same sequences computing the same
tokens: every what-if starts that way, until its settings change a step), it *is* the recording:
requests arrive before the step they arrived before, and each step starts and lasts as it did.
From the first step that differs the simulation goes its own way: a request is added at the
first step boundary after its recorded time (scaled by `rate_scale`), as a serving loop adds it
between steps, a step takes the cost model's time, an aborted request stops as long after its
arrival as it did then. Under the recorded settings it never differs, so
the replay reproduces the recorded run: blocks per step, preemptions, prefix hits, concurrency.

Every simulation runs under a `SimBudget` of steps and seconds, since settings can ask for
far more steps than the recording took (one 10^6-token prompt at max_batched_tokens=1 is 10^6
steps, each kept): past either, it stops with SimulationStopped saying how far it got.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from kvscope.engine.kv.events import KVEvent, SequenceAdmitted
from kvscope.engine.sampling_params import SamplingParams
from kvscope.engine.scheduler import ScheduledBatch
from kvscope.engine.sequence import Request, Sequence
from kvscope.engine.trace import Trace, TracedRequest, TracedStep
from kvscope.engine.trace.records import StepShape
from kvscope.engine.whatif.cost_model import CostModel
from kvscope.engine.whatif.settings import SimConfig, WhatIf, resolve
from kvscope.engine.whatif.sim_engine import RecordedOutputs, RecordedRunner, SimEngine
from kvscope.engine.whatif.summary import RequestOutcome, SimSummary, summarize

__all__ = ["simulate"]

# The steps a simulation may take: 10x the recording's, at least 100,000 (a few seconds of
# an empty trace's worth), at most 10^6 (each kept step is ~200 B; a step takes ~0.3 ms).
STEPS_PER_RECORDED_STEP = 10
MIN_STEP_BUDGET, MAX_STEP_BUDGET = 100_000, 1_000_000
DEFAULT_TIME_BUDGET_S = 300.0
BUDGET_CHECK_STEPS = 256  # the clock is read once in this many steps


class SimulationStopped(ValueError):
    """A simulation ran out of its budget: the message says how far it got and which ran out."""


@dataclass(frozen=True)
class SimBudget:
    max_steps: int
    max_seconds: float = DEFAULT_TIME_BUDGET_S

    @classmethod
    def for_trace(cls, trace: Trace, max_seconds: float = DEFAULT_TIME_BUDGET_S) -> SimBudget:
        steps = STEPS_PER_RECORDED_STEP * len(trace.steps)
        return cls(min(MAX_STEP_BUDGET, max(MIN_STEP_BUDGET, steps)), max_seconds)


@dataclass
class SimResult:
    config: SimConfig
    steps: list[TracedStep]  # the simulated steps, as a trace records them (times from 0)
    requests: list[RequestOutcome]
    summary: SimSummary
    cost: CostModel
    events: list[KVEvent] | None = None  # every KV event, with keep_events (for the block map)

    @property
    def diverged_at(self) -> int | None:
        return self.summary.diverged_at


def simulate(
    trace: Trace,
    what: WhatIf | None = None,
    cost: CostModel | None = None,
    keep_events: bool = False,
    between_steps: Callable[[], None] | None = None,
    budget: SimBudget | None = None,
) -> SimResult:
    """`between_steps`, when given, is called before every simulated step: it may block (the
    app holds its simulations there while its engine generates, since a Python thread replaying
    steps beside it makes every engine step wait for the GIL) or raise to stop the simulation
    (a newer one supersedes it). Past `budget` (default: `SimBudget.for_trace`) it raises
    SimulationStopped."""
    config = resolve(trace.settings, what or WhatIf())
    budget = budget or SimBudget.for_trace(trace)
    return _Simulation(trace, config, cost, keep_events, between_steps, budget).run()


class _Simulation(RecordedRunner):
    """The loop around a SimEngine; also its runner, so that a step's time is known (and the
    clock moves) while the engine runs it, as a real step's does."""

    def __init__(
        self,
        trace: Trace,
        config: SimConfig,
        cost: CostModel | None,
        keep_events: bool,
        between_steps: Callable[[], None] | None = None,
        budget: SimBudget | None = None,
    ) -> None:
        self.trace, self.config = trace, config
        self.budget = budget or SimBudget.for_trace(trace)
        self.between_steps = between_steps or _no_pause
        self.cost = cost or CostModel.fit(trace.steps)
        finished = trace.finished_requests
        outputs = {r.request_id: _recorded(trace, r) for r in finished}
        self.engine = SimEngine(config, trace.settings, outputs, _vocab(finished, outputs))
        if keep_events:
            self.engine.keep_events()
        self.recompute_hits = 0
        self.engine.observers.events.subscribe(self._count_recompute_hits)
        self.engine.runner = self
        self.t0 = min([r.time for r in finished] + [s.time for s in trace.steps[:1]], default=0)
        self.recorded = {s.step - trace.start_step: s for s in trace.steps}
        self.pending: deque[TracedRequest] = deque(sorted(finished, key=lambda r: (r.step, r.time)))
        # Aborted requests: the step they were aborted before, and how long after arriving.
        self.aborts = {
            r.request_id: (f.step - trace.start_step, f.time - r.time)
            for r in finished
            if "abort" in (f := trace.finishes[r.request_id]).reasons
        }
        self.abort_at: dict[str, float] = {}
        self.on_track = config.rate_scale == 1.0
        self.diverged_at: int | None = None if self.on_track else 1
        # By id: the request, when it arrived (simulated seconds) and the engine's step count then.
        self.arrived: dict[str, tuple[Request, float, int]] = {}
        self.rejected = 0
        self.steps: list[TracedStep] = []
        self._step_start = 0.0
        self._step_duration = 0.0

    def run(self) -> SimResult:
        try:
            return self._run()
        finally:
            # The engine calls its runner, this object, which holds the engine: let go of that
            # cycle, or a simulation's whole graph (47,000 objects on a 2,461-step trace) waits
            # for a full collection, which holds the GIL meanwhile (a thread beside a sweep
            # waited up to 115 ms for it; 96 ms with this, 29 ms with the collector off).
            self.engine.runner = RecordedRunner()
            self.engine.observers.events.unsubscribe(self._count_recompute_hits)  # the same

    def _run(self) -> SimResult:
        engine = self.engine
        started = time.monotonic()
        while self.pending or engine.has_unfinished_requests():
            self.between_steps()
            k = engine.num_steps + 1
            if k > self.budget.max_steps:
                self._stop(f"{self.budget.max_steps:,} steps, its step budget")
            if k % BUDGET_CHECK_STEPS == 0:
                elapsed = time.monotonic() - started
                if elapsed > self.budget.max_seconds:
                    self._stop(
                        f"{elapsed:,.0f} s, past its time budget of {self.budget.max_seconds:g} s"
                    )
            if self.on_track and k not in self.recorded:
                self._diverge(k)
            self._arrivals(k)
            self._due_aborts(k)
            if not engine.has_unfinished_requests():
                if self.on_track and self.pending:
                    # The recording ran step k; these settings refused what it ran: from here
                    # requests come by time (else the step count never moves).
                    self._diverge(k)
                continue
            self._step_start = engine.clock
            engine.step()  # calls execute() below, which sets the step's duration
            if engine.num_steps != k:
                raise RuntimeError(f"the simulation scheduled nothing in step {k}")
            step = engine.trace.steps[-1]
            self.steps.append(
                dataclasses.replace(step, time=self._step_start, duration=self._step_duration)
            )
            if not self.on_track:
                engine.clock += self.cost.gap_s
        outcomes = [RequestOutcome.of(req, at, step) for req, at, step in self.arrived.values()]
        summary = summarize(
            self.steps, outcomes, self.rejected, self.diverged_at, self.recompute_hits
        )
        return SimResult(self.config, self.steps, outcomes, summary, self.cost, engine.events)

    def _count_recompute_hits(self, event: KVEvent) -> None:
        if isinstance(event, SequenceAdmitted) and not event.first:
            self.recompute_hits += event.hit_tokens

    def _stop(self, why: str) -> None:
        done = sum(r.is_finished for r, _, _ in self.arrived.values())
        total = len(self.arrived) + len(self.pending) + self.rejected
        raise SimulationStopped(
            f"stopped after {why}: {self.engine.num_steps:,} steps simulated "
            f"({self.engine.clock:,.1f} s of modelled time), {done:,} of {total:,} requests "
            "finished"
        )

    # ---- the runner: called by engine.step() with the batch it scheduled ------------------
    def execute(self, batch: ScheduledBatch) -> tuple[list[Sequence], torch.Tensor]:
        k = self.engine.num_steps
        shape = StepShape.of(batch.items)
        if self.on_track and shape != self.recorded[k].shape:
            self._diverge(k)
        self._step_duration = (
            self.recorded[k].duration if self.on_track else self.cost.step_s(shape)
        )
        self.engine.clock += self._step_duration
        return super().execute(batch)

    # ---- between steps --------------------------------------------------------------------
    def _arrivals(self, k: int) -> None:
        engine, pending = self.engine, self.pending
        if self.on_track:
            engine.clock = max(engine.clock, self.recorded[k].time - self.t0)
            while pending and pending[0].step - self.trace.start_step < k:
                r = pending.popleft()
                self._arrive(r, min(engine.clock, self._arrival_time(r)))
            return
        if pending and not engine.has_unfinished_requests():
            engine.clock = max(engine.clock, self._arrival_time(pending[0]))
        while pending and self._arrival_time(pending[0]) <= engine.clock:
            # Arrived during the step just run, it is added now, at this step boundary: the
            # engine's own metrics count a request's wait from there too (add_request's time).
            self._arrive(pending.popleft(), engine.clock)

    def _arrive(self, r: TracedRequest, at: float) -> None:
        params = SamplingParams(n=r.n, max_tokens=r.max_tokens, ignore_eos=True)
        try:
            self.engine.add_request(r.request_id, "", params, at, list(r.prompt_token_ids))
        except ValueError:  # these settings cannot hold its prompt (pool or max_model_len)
            self.rejected += 1
            return
        self.arrived[r.request_id] = (self.engine.requests[r.request_id], at, self.engine.num_steps)
        if r.request_id in self.aborts:
            self.abort_at[r.request_id] = at + self.aborts[r.request_id][1]

    def _due_aborts(self, k: int) -> None:
        for request_id, due in list(self.abort_at.items()):
            before_step = self.aborts[request_id][0] < k
            if before_step if self.on_track else due <= self.engine.clock:
                self.engine.abort_request(request_id)
                del self.abort_at[request_id]

    def _arrival_time(self, r: TracedRequest) -> float:
        return (r.time - self.t0) / self.config.rate_scale

    def _diverge(self, k: int) -> None:
        self.on_track = False
        self.diverged_at = self.diverged_at or k


def _recorded(trace: Trace, r: TracedRequest) -> RecordedOutputs:
    finish = trace.finishes[r.request_id]
    return finish.outputs, finish.reasons


def _vocab(requests: Iterable[TracedRequest], outputs: dict[str, RecordedOutputs]) -> int:
    """Token ids only go back through the allocator's hashes: any bound above them will do."""
    top = max((max(r.prompt_token_ids) for r in requests), default=0)
    for produced, _ in outputs.values():
        top = max([top] + [max(p) for p in produced if p])
    return top + 1


def _no_pause() -> None:
    pass
