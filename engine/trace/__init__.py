"""The traffic trace: what every request and step of a session did, for what-if replays
(engine.whatif). The engine keeps one always (`LLMEngine.trace`); recordings carry it."""

from kvscope.engine.trace.file import read_trace
from kvscope.engine.trace.log import Trace, TraceLog
from kvscope.engine.trace.records import (
    PoolCounts,
    StepShape,
    TracedFinish,
    TracedRequest,
    TracedStep,
    TraceSettings,
)

__all__ = [
    "PoolCounts",
    "StepShape",
    "Trace",
    "TraceLog",
    "TraceSettings",
    "TracedFinish",
    "TracedRequest",
    "TracedStep",
    "read_trace",
]
