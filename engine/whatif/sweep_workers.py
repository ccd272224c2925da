"""A sweep's points in worker processes that may die (out of memory, kill -9).

multiprocessing.Pool replaces a dead worker but loses the task it held, so `imap` waited for
that point forever (issue 43), and the replacement waited forever for the trace it is handed
once. Here each worker has a pipe of its own, and the caller waits on every pipe and every
process's sentinel together: a death is seen at once, with the point it took. That point runs
once more in a fresh worker; a second death (or more deaths than the sweep has points) stops
the sweep with SweepWorkerDied naming the point, and every worker is terminated on the way out.

Workers are spawned (safe beside threads, on every platform) with SIGINT ignored from their
start: Ctrl-C reaches the caller, whose way out terminates them, so no worker prints a
traceback. The trace is pickled once and each worker's copy is written by a thread of its own,
while the workers import (written in turn, each would wait for the one before to import torch).
No queue is shared: a worker killed while holding a shared queue's lock would hang the rest.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from kvscope.engine.trace import Trace
from kvscope.engine.whatif.cost_model import CostModel
from kvscope.engine.whatif.settings import WhatIf
from kvscope.engine.whatif.simulate import SimBudget, simulate
from kvscope.engine.whatif.summary import SimSummary

RUNS_PER_POINT = 2  # a point whose worker dies is run once more, then the sweep stops
READY = "ready"
JOIN_S = 5.0  # for a terminated worker to go


class SweepWorkerDied(RuntimeError):
    """A sweep's worker process died running a point, and again when it was run once more."""


@dataclass(frozen=True)
class SweepPoint:
    what: WhatIf
    summary: SimSummary | None  # None: these settings cannot run (see error)
    num_blocks: int = 0
    error: str = ""


def simulate_point(
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


class _Worker:
    def __init__(self, context: multiprocessing.context.SpawnContext, blob: bytes) -> None:
        self.conn, theirs = context.Pipe()
        self.process: BaseProcess = context.Process(target=_serve, args=(theirs,), daemon=True)
        with _sigint_ignored():  # inherited from the interpreter's start
            self.process.start()
        theirs.close()
        self.ready = False
        self.point: int | None = None  # the index of the point it runs
        threading.Thread(target=_hand, args=(self.conn, blob), daemon=True).start()

    @property
    def waited_on(self) -> bool:
        """Whether a message is due from it: that it is ready, or its point's result."""
        return not self.ready or self.point is not None

    def how_it_died(self) -> str:
        self.process.join(JOIN_S)
        code = self.process.exitcode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"killed by {name}" + (" (out of memory, or kill -9)" if -code == 9 else "")
        return f"exit code {code}" if code is not None else "its pipe closed"

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
        self.process.join(JOIN_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(JOIN_S)
        self.conn.close()


def run_points(
    payload: tuple[Trace, CostModel, SimBudget],
    points: list[WhatIf],
    processes: int,
    on_point: Callable[[SweepPoint], None] | None = None,
    cancelled: Callable[[], bool] = lambda: False,
) -> list[SweepPoint]:
    """Each point simulated in one of `processes` workers; the points in order (`on_point`
    hears of each in order too). SweepWorkerDied when a point's worker died twice."""
    context = multiprocessing.get_context("spawn")
    blob = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    todo: deque[int] = deque(range(len(points)))
    runs = [0] * len(points)
    starts_left = processes + len(points)  # deaths between points are replaced this often
    done: dict[int, SweepPoint] = {}
    out: list[SweepPoint] = []
    workers: list[_Worker] = []
    try:
        for _ in range(min(processes, len(points))):
            workers.append(_Worker(context, blob))
            starts_left -= 1
        while len(out) < len(points) and not cancelled():
            for worker in workers:
                if worker.ready and worker.point is None and todo:
                    worker.point = todo.popleft()
                    runs[worker.point] += 1
                    with contextlib.suppress(OSError):  # it died: the wait below sees it
                        worker.conn.send(points[worker.point])
            # Every sentinel: a worker that dies between points is replaced too.
            watched = [w.conn for w in workers if w.waited_on]
            ready = wait(watched + [w.process.sentinel for w in workers])
            for worker in list(workers):
                if worker.conn not in ready and worker.process.sentinel not in ready:
                    continue
                message = _receive(worker)
                if message is None:  # it died
                    workers.remove(worker)
                    _died(worker, points, runs, todo)
                    if todo and len(workers) < processes:
                        if starts_left <= 0:
                            raise SweepWorkerDied(
                                f"sweep workers kept dying ({worker.how_it_died()}, the last); "
                                f"{len(out)} of {len(points)} points done"
                            )
                        workers.append(_Worker(context, blob))
                        starts_left -= 1
                elif message == READY:
                    worker.ready = True
                else:
                    assert worker.point is not None and isinstance(message, SweepPoint)
                    done[worker.point], worker.point = message, None
            while len(out) in done:
                out.append(done.pop(len(out)))
                if on_point is not None:
                    on_point(out[-1])
        return out
    finally:  # done, or Ctrl-C, or an error: the workers go
        for worker in workers:
            worker.stop()


def _receive(worker: _Worker) -> object | None:
    """The worker's next message, or None when it has died (its pipe at its end)."""
    try:
        if worker.conn.poll():  # a result it sent before it died is still its result
            message: object = worker.conn.recv()
            return message
    except (EOFError, OSError):
        return None
    return None  # only its sentinel was ready: it exited with nothing more to say


def _died(worker: _Worker, points: list[WhatIf], runs: list[int], todo: deque[int]) -> None:
    """Put the point a dead worker held back first in line, or stop the sweep when it has
    had its runs."""
    index = worker.point
    worker.stop()
    if index is None:
        return
    if runs[index] >= RUNS_PER_POINT:
        raise SweepWorkerDied(
            f"sweep point {index + 1} of {len(points)} ({points[index].describe()}): its "
            f"worker process died {runs[index]} times ({worker.how_it_died()}, the last); "
            "the sweep stopped"
        )
    todo.appendleft(index)


def _hand(conn: Connection, blob: bytes) -> None:
    with contextlib.suppress(OSError):  # the worker died before it read its copy
        conn.send_bytes(blob)


def _serve(conn: Connection) -> None:
    """A worker: the trace once, then a point at a time until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # where it was not inherited ignored
    trace, cost, budget = pickle.loads(conn.recv_bytes())
    conn.send(READY)
    while True:
        try:
            what = conn.recv()
        except EOFError:
            return
        conn.send(simulate_point(trace, what, cost, budget))


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while a worker starts (milliseconds: the trace follows through its
    pipe), so that it inherits it and only this process hears a Ctrl-C; only the main thread
    may change it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
