"""Many what-ifs over one trace: a grid of settings, each simulated, one cost model for all.

`grid({"block_size": [8, 16, 32], "kv_pool": [...]})` is every combination; `sweep` runs them
and returns each one's summary (or the reason its settings cannot run, e.g. a pool that holds no
block). One simulation of a 2,000-step trace takes about half a second on one core, all of it
Python (the engine's scheduler and allocator), so a sweep of 20 takes ~12 s in one thread;
`workers` > 1 runs it in that many processes (engine.whatif.sweep_workers: a worker that dies
costs a rerun of its point, a second death stops the sweep naming the point). The app runs its
sweeps in one background thread, point by point, so a plot fills as they come; the command line
uses the machine's physical cores.

A grid holds at most MAX_SWEEP_POINTS settings (100 x 100 x 100 once ran for minutes before
printing anything); each point runs under its simulation's budget (`SimBudget`), and
`on_point` hears of each as it ends.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import fields
from typing import Any

from kvscope.engine.trace import Trace
from kvscope.engine.whatif.cost_model import CostModel
from kvscope.engine.whatif.settings import WhatIf
from kvscope.engine.whatif.simulate import SimBudget
from kvscope.engine.whatif.sweep_workers import (
    SweepPoint,
    SweepWorkerDied,
    run_points,
    simulate_point,
)

__all__ = ["SweepPoint", "SweepWorkerDied", "sweep"]

KNOBS = tuple(f.name for f in fields(WhatIf))
# Settings one sweep runs: a few hours of simulation at ~10 s each, far past any plot's points.
MAX_SWEEP_POINTS = 1000


def grid(values: dict[str, Iterable[Any]]) -> list[WhatIf]:
    """Every combination of the knobs' values, the first knob varying slowest."""
    for name in values:
        if name not in KNOBS:
            raise ValueError(f"unknown what-if setting {name!r}; one of {sorted(KNOBS)}")
    names = list(values)
    axes = [list(values[n]) for n in names]
    check_sweep_size([len(axis) for axis in axes])
    combos = itertools.product(*axes)
    return [WhatIf(**dict(zip(names, combo, strict=True))) for combo in combos]


def check_sweep_size(axis_lengths: list[int]) -> None:
    """ValueError with the count and the bound for a grid of more than MAX_SWEEP_POINTS,
    counted before any combination is made."""
    count = math.prod(axis_lengths)
    if count > MAX_SWEEP_POINTS:
        shape = " x ".join(f"{n:,}" for n in axis_lengths)
        raise ValueError(
            f"{count:,} combinations of settings ({shape}) are more than the "
            f"{MAX_SWEEP_POINTS:,} one sweep runs"
        )


def sweep(
    trace: Trace,
    points: list[WhatIf],
    cost: CostModel | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    workers: int = 1,
    between_steps: Callable[[], None] | None = None,
    budget: SimBudget | None = None,
    on_point: Callable[[SweepPoint], None] | None = None,
) -> list[SweepPoint]:
    """Each point simulated, in order; `cancelled` is asked between points, `between_steps`
    between each one's steps (see `simulate`; in this process only), `on_point` told of each
    point as it ends (in order). SweepWorkerDied when a worker process died running a point
    twice."""
    check_sweep_size([len(points)])
    cost = cost or CostModel.fit(trace.steps)
    budget = budget or SimBudget.for_trace(trace)
    if workers > 1 and len(points) > 1:
        return run_points((trace, cost, budget), points, workers, on_point, cancelled)
    out: list[SweepPoint] = []
    for what in points:
        if cancelled():
            break
        out.append(simulate_point(trace, what, cost, budget, between_steps))
        if on_point is not None:
            on_point(out[-1])
    return out
