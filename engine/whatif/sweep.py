"""Many what-ifs over one trace: a grid of settings, each simulated, one cost model for all.

`grid({"block_size": [8, 16, 32], "kv_pool": [...]})` is every combination; `sweep` runs them
and returns each one's summary (or the reason its settings cannot run, e.g. a pool that holds no
block). One simulation of a 2,000-step trace takes a fraction of a second, so a sweep runs in
the caller's thread; nothing here starts threads or processes (the app runs it off its GUI
thread, the command line in its own).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields

from engine.trace import Trace
from engine.whatif.cost_model import CostModel
from engine.whatif.settings import WhatIf
from engine.whatif.simulate import simulate
from engine.whatif.summary import SimSummary

KNOBS = tuple(f.name for f in fields(WhatIf))


@dataclass(frozen=True)
class SweepPoint:
    what: WhatIf
    summary: SimSummary | None  # None: these settings cannot run (see error)
    num_blocks: int = 0
    error: str = ""


def grid(values: dict[str, Iterable]) -> list[WhatIf]:
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
) -> list[SweepPoint]:
    cost = cost or CostModel.fit(trace.steps)
    out = []
    for what in points:
        if cancelled():
            break
        try:
            result = simulate(trace, what, cost)
        except ValueError as e:
            out.append(SweepPoint(what, None, 0, str(e)))
            continue
        out.append(SweepPoint(what, result.summary, result.config.num_blocks))
    return out
