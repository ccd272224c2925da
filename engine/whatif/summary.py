"""What a simulated (or recorded) run comes to: the figures a what-if is compared by.

Allocation: preemptions, peak concurrency, peak blocks held, requests that had to wait (not
scheduled in the first step after they arrived), requests the settings could not hold at all.
Time (modelled off the recording): waiting time and time to first token per request, and the
run's makespan from the first arrival to the last step's end.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kvscope.engine.trace import Trace, TracedFinish, TracedStep

if TYPE_CHECKING:
    from kvscope.engine.sequence import Request


@dataclass(frozen=True)
class RequestOutcome:
    request_id: str
    arrival: float  # seconds from the trace's start
    arrival_step: int  # the engine's step count when it arrived
    first_scheduled_step: int  # 0: never scheduled
    wait_s: float | None  # arrival to first scheduled
    ttft_s: float | None  # arrival to its first token
    num_preemptions: int

    @property
    def waited(self) -> bool:
        return self.first_scheduled_step > self.arrival_step + 1

    @classmethod
    def of(cls, request: Request, arrival: float, arrival_step: int) -> RequestOutcome:
        m = request.metrics
        return cls(
            request.request_id,
            arrival,
            arrival_step,
            request.first_scheduled_step,
            None if m.first_scheduled_time is None else m.first_scheduled_time - arrival,
            None if m.first_token_time is None else m.first_token_time - arrival,
            sum(s.num_preemptions for s in request.sequences),
        )


@dataclass(frozen=True)
class SimSummary:
    steps: int
    makespan_s: float
    busy_s: float  # the steps' summed durations
    preemptions: int
    peak_running: int
    peak_blocks_used: int
    requests: int
    waited: int  # requests not scheduled in the first step after they arrived
    rejected: int  # requests whose prompt these settings cannot hold
    mean_wait_s: float
    p95_wait_s: float
    mean_ttft_s: float
    p50_ttft_s: float
    p95_ttft_s: float
    prefix_hit_tokens: int
    diverged_at: int | None  # the first step unlike the recording's; None: none was
    # Of prefix_hit_tokens, those a preempted sequence found again when it was re-admitted
    # (its own blocks, still cached): more preemptions, more of these. None where unknown (a
    # recording's own figures: its steps count hits, not whose).
    recompute_hit_tokens: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(
    steps: list[TracedStep],
    outcomes: list[RequestOutcome],
    rejected: int,
    diverged_at: int | None,
    recompute_hit_tokens: int | None = None,
) -> SimSummary:
    waits = [o.wait_s for o in outcomes if o.wait_s is not None]
    ttfts = [o.ttft_s for o in outcomes if o.ttft_s is not None]
    first = min((o.arrival for o in outcomes), default=0.0)
    end = max((s.time + s.duration for s in steps), default=first)
    return SimSummary(
        steps=len(steps),
        makespan_s=end - first,
        busy_s=float(sum(s.duration for s in steps)),
        preemptions=steps[-1].preemptions if steps else 0,
        peak_running=max((s.running for s in steps), default=0),
        peak_blocks_used=max((s.blocks_used for s in steps), default=0),
        requests=len(outcomes),
        waited=sum(o.waited for o in outcomes),
        rejected=rejected,
        mean_wait_s=float(np.mean(waits)) if waits else 0.0,
        p95_wait_s=_pct(waits, 95),
        mean_ttft_s=float(np.mean(ttfts)) if ttfts else 0.0,
        p50_ttft_s=_pct(ttfts, 50),
        p95_ttft_s=_pct(ttfts, 95),
        prefix_hit_tokens=steps[-1].prefix_hit_tokens if steps else 0,
        diverged_at=diverged_at,
        recompute_hit_tokens=recompute_hit_tokens,
    )


def recorded_summary(trace: Trace) -> SimSummary:
    """The same figures of the recorded run itself, from its trace."""
    t0 = min([r.time for r in trace.requests] + [s.time for s in trace.steps[:1]], default=0.0)
    outcomes = []
    for r in trace.finished_requests:
        f: TracedFinish = trace.finishes[r.request_id]
        scheduled = _step_start(trace, f.first_scheduled_step)
        token = _step_end(trace, f.first_token_step)
        outcomes.append(
            RequestOutcome(
                r.request_id,
                r.time - t0,
                r.step - trace.start_step,
                f.first_scheduled_step - trace.start_step if f.first_scheduled_step else 0,
                None if scheduled is None else max(0.0, scheduled - r.time),
                None if token is None else token - r.time,
                0,
            )
        )
    steps = [s for s in trace.steps]
    shifted = [s.__class__(**{**asdict(s), "time": s.time - t0}) for s in steps]
    return summarize(shifted, outcomes, 0, None)


def _step_start(trace: Trace, step: int) -> float | None:
    found = _find(trace, step)
    return None if found is None else found.time


def _step_end(trace: Trace, step: int) -> float | None:
    found = _find(trace, step)
    return None if found is None else found.time + found.duration


def _find(trace: Trace, step: int) -> TracedStep | None:
    if not step or not trace.steps:
        return None
    index = step - trace.steps[0].step
    if 0 <= index < len(trace.steps) and trace.steps[index].step == step:
        return trace.steps[index]
    return next((s for s in trace.steps if s.step == step), None)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0
