"""The jobs the panel gives its SimRunner: the recorded replay, a what-if, a sweep.

Each simulation's PoolSeeker is walked to the end on the runner's thread (`warm_seeker`): its
checkpoints keep every move of the time slider short on the GUI thread, where a first seek to
the end of 50,000 steps would replay them all (over a second; 24 ms for 1,000 steps here).

A sweep runs a point at a time, so that one point that never ends costs that point, not the
sweep: each point beats the runner's watch; when the runner gives a stuck point up, `rest()`
is a job for the points after it, with the stuck one kept as a point that could not run (and
when none are left, its `done` is the whole sweep).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from kvscope.app.desktop.whatif.runner import JobControl
from kvscope.engine.trace import Trace
from kvscope.engine.whatif import (
    CHECKPOINT_STEPS,
    CostModel,
    PoolSeeker,
    SimResult,
    SimSummary,
    SweepPoint,
    WhatIf,
    recorded_summary,
    simulate,
    sweep,
)

Pause = Callable[[], None]
# What each kind of job returns (its Outcome's `result`).
RecordedRun = tuple[SimResult, SimSummary, PoolSeeker, PoolSeeker]
WhatIfRun = tuple[WhatIf, SimResult, PoolSeeker]
SweepRun = tuple[str, list[SweepPoint]]


def _no_pause() -> None:
    pass


def warm_seeker(result: SimResult, between_steps: Pause = _no_pause) -> PoolSeeker:
    """A seeker over the run that has been to its last step once (its checkpoints taken), a
    checkpoint's stride at a time with `between_steps` between (see `JobControl`)."""
    assert result.events is not None  # the jobs below simulate with keep_events=True
    seeker = PoolSeeker(result.config, result.events)
    for step in range(CHECKPOINT_STEPS, seeker.last_step + CHECKPOINT_STEPS, CHECKPOINT_STEPS):
        between_steps()
        seeker.at(step)
    return seeker


def replay_recorded(trace: Trace, between_steps: Pause = _no_pause) -> RecordedRun:
    """The recorded side: the trace replayed as it ran (its pool at every step), its own
    figures, and two seekers over it (the recorded map's, and the what-if map's while the knobs
    are as recorded)."""
    result = simulate(trace, keep_events=True, between_steps=between_steps)
    seekers = warm_seeker(result, between_steps), warm_seeker(result, between_steps)
    figures = recorded_summary(trace)
    if result.diverged_at is None:  # the replay is the recording: whose hits they were too
        figures = replace(figures, recompute_hit_tokens=result.summary.recompute_hit_tokens)
    return result, figures, *seekers


def simulate_whatif(
    trace: Trace, what: WhatIf, cost: CostModel, between_steps: Pause = _no_pause
) -> WhatIfRun:
    result = simulate(trace, what, cost=cost, keep_events=True, between_steps=between_steps)
    return what, result, warm_seeker(result, between_steps)


class SweepJob:
    def __init__(self, knob: str, trace: Trace, points: list[WhatIf], cost: CostModel) -> None:
        self.knob, self.trace, self.points, self.cost = knob, trace, list(points), cost
        self.done: list[SweepPoint] = []  # appended on the runner's thread, in order

    def __call__(self, control: JobControl) -> SweepRun:
        for what in self.points[len(self.done) :]:
            if control.cancelled():
                break
            control.heartbeat()
            points = sweep(self.trace, [what], self.cost, between_steps=control.between_steps)
            self.done.extend(points)
        return self.knob, list(self.done)

    def rest(self, why: str) -> SweepJob | None:  # None: no point was in progress
        """After the runner gave up the point in progress: a job for the points past it, the
        stuck one kept as a point that could not run (when it was the last, the new job's `done`
        is the whole sweep). A new job: the stuck thread may still append to this one's list."""
        done = list(self.done)
        if len(done) >= len(self.points):
            return None
        done.append(SweepPoint(self.points[len(done)], None, 0, why))
        rest = SweepJob(self.knob, self.trace, self.points, self.cost)
        rest.done = done
        return rest
