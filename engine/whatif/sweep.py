"""Many what-ifs over one trace: a grid of settings, each simulated, one cost model for all.

`grid({"block_size": [8, 16, 32], "kv_pool": [...]})` is every combination; `sweep` runs them
and returns each one's summary (or the reason its settings cannot run, e.g. a pool that holds no
block). One simulation of a 2,000-step trace takes about half a second on one core, all of it
Python (the engine's scheduler and allocator), so a sweep of 20 takes ~12 s in one thread;
`workers` > 1 runs it in that many processes (spawned: safe beside threads, on every platform),
each given the trace once. The app runs its sweeps in one background thread, point by point,
so a plot fills as they come; the command line uses the machine's physical cores.
"""

from __future__ import annotations

import itertools
import multiprocessing
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields
from typing import Any

from kvscope.engine.trace import Trace
from kvscope.engine.whatif.cost_model import CostModel
from kvscope.engine.whatif.settings import WhatIf
from kvscope.engine.whatif.simulate import simulate
from kvscope.engine.whatif.summary import SimSummary

__all__ = ["sweep"]

KNOBS = tuple(f.name for f in fields(WhatIf))


@dataclass(frozen=True)
class SweepPoint:
    what: WhatIf
    summary: SimSummary | None  # None: these settings cannot run (see error)
    num_blocks: int = 0
    error: str = ""


def grid(values: dict[str, Iterable[Any]]) -> list[WhatIf]:
    """Every combination of the knobs' values, the first knob varying slowest."""
    for name in values:
        if name not in KNOBS:
            raise ValueError(f"unknown what-if setting {name!r}; one of {sorted(KNOBS)}")
    names = list(values)
    combos = itertools.product(*(list(values[n]) for n in names))
    return [WhatIf(**dict(zip(names, combo, strict=True))) for combo in combos]


def sweep(
    trace: Trace,
    points: list[WhatIf],
    cost: CostModel | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    workers: int = 1,
    between_steps: Callable[[], None] | None = None,
) -> list[SweepPoint]:
    """Each point simulated, in order; `cancelled` is asked between points, `between_steps`
    between each one's steps (see `simulate`; in this process only)."""
    cost = cost or CostModel.fit(trace.steps)
    if workers > 1 and len(points) > 1:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            min(workers, len(points)), context, initializer=_take, initargs=(trace, cost)
        ) as pool:
            return list(pool.map(_point, points))
    out = []
    for what in points:
        if cancelled():
            break
        out.append(_simulated(trace, what, cost, between_steps))
    return out


def _simulated(
    trace: Trace, what: WhatIf, cost: CostModel, between_steps: Callable[[], None] | None = None
) -> SweepPoint:
    try:
        result = simulate(trace, what, cost, between_steps=between_steps)
    except ValueError as e:
        return SweepPoint(what, None, 0, str(e))
    return SweepPoint(what, result.summary, result.config.num_blocks)


_worker_trace: tuple[Trace, CostModel] | None = None


def _take(trace: Trace, cost: CostModel) -> None:
    """A worker process's initializer: the trace arrives once, not with every point."""
    global _worker_trace
    _worker_trace = trace, cost


def _point(what: WhatIf) -> SweepPoint:
    assert _worker_trace is not None
    return _simulated(*_worker_trace[:1], what, _worker_trace[1])
