"""Many what-ifs over one trace: a grid of settings, each simulated, one cost model for all.

`grid({"block_size": [8, 16, 32], "kv_pool": [...]})` is every combination; `sweep` runs them
and returns each one's summary (or the reason its settings cannot run, e.g. a pool that holds no
block). One simulation of a 2,000-step trace takes about half a second on one core, all of it
Python (the engine's scheduler and allocator), so a sweep of 20 takes ~12 s in one thread;
`workers` > 1 runs it in that many processes (spawned: safe beside threads, on every platform),
each given the trace once. The app runs its sweeps in one background thread, point by point,
so a plot fills as they come; the command line uses the machine's physical cores.

A grid holds at most MAX_SWEEP_POINTS settings (100 x 100 x 100 once ran for minutes before
printing anything); each point runs under its simulation's budget (`SimBudget`), and
`on_point` hears of each as it ends. Worker processes ignore Ctrl-C: the caller's process gets
it and the pool's workers are terminated with it, so nothing prints a worker's traceback.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import multiprocessing
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any

from kvscope.engine.trace import Trace
from kvscope.engine.whatif.cost_model import CostModel
from kvscope.engine.whatif.settings import WhatIf
from kvscope.engine.whatif.simulate import SimBudget, simulate
from kvscope.engine.whatif.summary import SimSummary

__all__ = ["sweep"]

KNOBS = tuple(f.name for f in fields(WhatIf))
# Settings one sweep runs: a few hours of simulation at ~10 s each, far past any plot's points.
MAX_SWEEP_POINTS = 1000


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
    point as it ends (in order)."""
    check_sweep_size([len(points)])
    cost = cost or CostModel.fit(trace.steps)
    budget = budget or SimBudget.for_trace(trace)
    out: list[SweepPoint] = []
    if workers > 1 and len(points) > 1:
        context = multiprocessing.get_context("spawn")
        processes = min(workers, len(points))
        handed: multiprocessing.Queue[tuple[Trace, CostModel, SimBudget]] = context.Queue()
        # Terminated workers leave it unread: exiting must not wait to flush it to them.
        handed.cancel_join_thread()
        pool = None
        try:
            with _sigint_ignored():  # the workers inherit it, from their interpreter's start
                pool = context.Pool(processes, _take, (handed,))
            for _ in range(processes):
                handed.put((trace, cost, budget))
            for point in pool.imap(_point, points):
                out.append(point)
                if on_point is not None:
                    on_point(point)
        finally:  # done, or Ctrl-C, or an error: the workers go
            if pool is not None:
                pool.terminate()
        return out
    for what in points:
        if cancelled():
            break
        out.append(_simulated(trace, what, cost, budget, between_steps))
        if on_point is not None:
            on_point(out[-1])
    return out


def _simulated(
    trace: Trace,
    what: WhatIf,
    cost: CostModel,
    budget: SimBudget,
    between_steps: Callable[[], None] | None = None,
) -> SweepPoint:
    try:
        result = simulate(trace, what, cost, between_steps=between_steps, budget=budget)
    except ValueError as e:  # settings that cannot run, a pool too large, a spent budget
        return SweepPoint(what, None, 0, str(e))
    return SweepPoint(what, result.summary, result.config.num_blocks)


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while the workers are started (milliseconds: the trace follows through a
    queue), so that they inherit it and only this process hears a Ctrl-C; only the main
    thread may change it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


_worker_trace: tuple[Trace, CostModel, SimBudget] | None = None


def _take(handed: multiprocessing.Queue[tuple[Trace, CostModel, SimBudget]]) -> None:
    """A worker process's initializer: the trace arrives once, not with every point."""
    global _worker_trace
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # where SIGINT was not inherited ignored
    _worker_trace = handed.get()


def _point(what: WhatIf) -> SweepPoint:
    assert _worker_trace is not None
    trace, cost, budget = _worker_trace
    return _simulated(trace, what, cost, budget)
