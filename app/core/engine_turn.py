"""One turn of whoever owns an engine: take the queued work, step once, hand out the outputs.

The desktop worker (app/desktop/engine_thread/worker.py) and `kvscope serve`'s engine thread
(app/serve/engine_loop.py) both run their engine through `run_turn`, so the two cannot drift
apart on what a failed step does: every source of work fails what it has in flight, and the
engine goes on serving the next request.

A source of work is anything with the three methods below (the server's EngineDriver, the
desktop's chat replies and simulated users). The engine is not thread-safe: call this on the
one thread that owns it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvscope.engine import LLMEngine, RequestOutput

__all__ = ["TurnResult", "WorkSource", "run_turn"]


class WorkSource(Protocol):
    def drain(self) -> None:
        """Put the work queued since the last turn into the engine (adds, aborts, calls)."""

    def deliver(self, outputs: list[RequestOutput]) -> None:
        """Hand this step's outputs to whoever waits for them (outputs of others included)."""

    def fail_all(self, error: Exception, engine_failed: bool = False) -> None:
        """End everything this source has in flight with `error`; `engine_failed`: a step
        raised it, rather than a stop."""


@dataclass
class TurnResult:
    stepped: bool  # the engine had work and ran a step (which may have raised)
    outputs: list[RequestOutput] = field(default_factory=list)
    seconds: float = 0.0  # the step's duration
    error: Exception | None = None  # what the step raised; every source has failed its work


def run_turn(
    engine: LLMEngine,
    sources: Sequence[WorkSource],
    before_step: Callable[[], None] | None = None,
) -> TurnResult:
    """Drain every source, step once if the engine has work, deliver or fail; `before_step`
    runs between the drain and the step (the desktop marks its engine busy there)."""
    for source in sources:
        source.drain()
    if not engine.has_unfinished_requests():
        return TurnResult(stepped=False)
    if before_step is not None:
        before_step()
    started = time.perf_counter()
    try:
        outputs = engine.step()
    except Exception as e:  # an engine bug: fail what is in flight, keep the engine serving
        for source in sources:
            source.fail_all(e, engine_failed=True)
        return TurnResult(True, seconds=time.perf_counter() - started, error=e)
    seconds = time.perf_counter() - started
    for source in sources:
        source.deliver(outputs)
    return TurnResult(True, outputs, seconds)
