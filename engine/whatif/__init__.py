"""What if: replay a session's own traffic under other settings, without the model.

`simulate(trace, WhatIf(block_size=32))` runs the trace's requests through the engine's own
scheduler and allocator (engine.whatif.sim_engine) and times the steps with a cost model fitted
to the trace (engine.whatif.cost_model); `sweep` runs a grid of them."""

from kvscope.engine.whatif.cost_model import CostModel
from kvscope.engine.whatif.pool_at import CHECKPOINT_STEPS, PoolSeeker
from kvscope.engine.whatif.settings import (
    SimConfig,
    SimulationTooLarge,
    WhatIf,
    check_simulated_pool,
    cost_caveat,
    recorded_config,
    resolve,
    simulated_pool_limit,
)
from kvscope.engine.whatif.simulate import SimBudget, SimResult, SimulationStopped, simulate
from kvscope.engine.whatif.summary import RequestOutcome, SimSummary, recorded_summary
from kvscope.engine.whatif.sweep import (
    KNOBS,
    MAX_SWEEP_POINTS,
    SweepPoint,
    SweepWorkerDied,
    check_sweep_size,
    grid,
    sweep,
)

__all__ = [
    "CHECKPOINT_STEPS",
    "KNOBS",
    "MAX_SWEEP_POINTS",
    "SimBudget",
    "SimulationStopped",
    "SimulationTooLarge",
    "check_simulated_pool",
    "check_sweep_size",
    "simulated_pool_limit",
    "CostModel",
    "PoolSeeker",
    "SweepPoint",
    "SweepWorkerDied",
    "grid",
    "sweep",
    "RequestOutcome",
    "SimConfig",
    "SimResult",
    "SimSummary",
    "WhatIf",
    "cost_caveat",
    "recorded_config",
    "recorded_summary",
    "resolve",
    "simulate",
]
