"""SimRunner: simulations and sweeps off the GUI thread, their outcomes back as a Qt signal.

A simulation of a few thousand steps takes a fraction of a second and a sweep a few seconds, in
Python: on the GUI thread either would freeze the window while a slider moves. Each kind of job
("recorded", "whatif", "sweep") has a generation; a new job of a kind supersedes the older ones,
which are skipped if they have not started and dropped when they end (a sweep also stops
between its points). Sweeps get a thread of their own, so a sweep in progress never holds up
the what-if a knob just asked for.

A job that stops beating (`heartbeat()`, at its start and between a sweep's points) for
`stuck_s` is given up: its kind gets an error outcome and the lane a fresh thread, so one
simulation that never ends cannot wedge the tab. The threads are daemons: a stuck one cannot
hold the app open at exit (concurrent.futures' workers are joined then, so they are not used).

The simulations yield to the engine: given the worker's `idle` event, a job waits before its
next simulated step while the engine generates or builds (`JobControl.between_steps`). A Python
thread replaying steps beside the engine's took the GIL back from it at every torch call it
made: on the real window a 48-token reply took 9.8 s instead of 1.5 s while a sweep ran (1.5 s
with the wait). A waiting job beats, so the watch never gives it up, and `paused` tells the
panel why nothing moves.

The outcome is emitted from the lane's thread; connected to a bound method of a GUI-thread
object, Qt queues it to the GUI thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QObject, QTimer, Signal

KINDS = ("recorded", "whatif", "sweep")
STUCK_S = 30.0  # a simulation of 50,000 steps takes a few seconds; this is one that never ends
WATCH_MS = 1000
PAUSE_POLL_S = 0.25  # how often a job waiting for the engine beats and looks for a newer job
# Every 4 ms of simulating, a job sleeps 0.5 ms: otherwise the GUI thread waits for the GIL at
# each Qt or SQLite call it makes (PERFORMANCE.md, "What-if beside the window").
YIELD_AFTER_S = 0.004
YIELD_S = 0.0005


class Superseded(Exception):
    """Raised in a job by `between_steps` once a newer job of its kind was asked for."""


@dataclass(frozen=True)
class JobControl:
    """What a job gets from its runner."""

    cancelled: Callable[[], bool]  # true once a newer job of its kind is asked for
    heartbeat: Callable[[], None]  # says the job still moves (the watch's stuck check)
    # Call before each simulated step: returns at once while the engine is idle, waits while it
    # works, raises Superseded once cancelled.
    between_steps: Callable[[], None]


@dataclass(frozen=True)
class Outcome:
    kind: str
    generation: int
    result: object = None
    error: str = ""  # the job's ValueError (bad settings) or another failure, for the panel
    stuck: bool = False  # given up by the watch: it stopped beating for stuck_s


class _Lane:
    """One daemon thread running queued jobs in order; `beat` is when the running one last
    showed progress (None while idle)."""

    def __init__(self, name: str) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.running: tuple[str, int] | None = None  # (kind, generation) of the running job
        self.beat: float | None = None
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            job(self)
            self.running = self.beat = None


class SimRunner(QObject):
    finished = Signal(object)  # Outcome, on the thread that ran the job
    paused = Signal(bool)  # a job waits for the engine (True) or goes on (False)

    def __init__(
        self,
        parent: QObject | None = None,
        stuck_s: float = STUCK_S,
        engine_idle: threading.Event | None = None,
    ) -> None:
        super().__init__(parent)
        self.stuck_s = stuck_s
        self.engine_idle = engine_idle  # set while the engine neither generates nor builds
        self._waiting: set[_Lane] = set()  # lanes whose job waits for the engine
        self._waiting_lock = threading.Lock()
        self._lanes = {name: _Lane(f"kvscope-{name}") for name in ("sim", "sweep")}
        self._generation = dict.fromkeys(KINDS, 0)
        self._closed = False
        self._watch = QTimer(self, interval=WATCH_MS)
        self._watch.timeout.connect(self.check_stuck)
        self._watch.start()

    def submit(self, kind: str, job: Callable[[JobControl], object]):
        """Run `job(control)` on its lane; returns the job's generation. `control.cancelled()`
        turns true once a newer job of the same kind is submitted (or the runner shuts down)."""
        if self._closed:
            raise RuntimeError("the what-if runner was shut down")
        self._generation[kind] += 1
        generation = self._generation[kind]
        self._lane(kind).jobs.put(lambda lane: self._run(lane, kind, generation, job))
        return generation

    def current(self, kind: str) -> int:
        """The generation whose outcome is wanted; an outcome of another one is stale."""
        return self._generation[kind]

    def cancel(self, kind: str) -> None:
        self._generation[kind] += 1

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Cancel everything and let the lanes end (a sweep stops at its next point, a
        simulation is under a second); a stuck thread is left to die with the process."""
        self._closed = True
        self._watch.stop()
        for kind in KINDS:
            self.cancel(kind)
        for lane in self._lanes.values():
            lane.jobs.put(None)
        for lane in self._lanes.values():
            lane.thread.join(timeout_s)

    def check_stuck(self) -> None:
        """Give up a job that has not beaten for stuck_s (the watch timer calls this)."""
        now = time.monotonic()
        for name, lane in list(self._lanes.items()):
            running, beat = lane.running, lane.beat
            if running is None or beat is None or now - beat < self.stuck_s:
                continue
            kind, generation = running
            self._lanes[name] = _Lane(f"kvscope-{name}")  # the old thread runs on, unheard
            lane.jobs.put(None)  # so it ends if its job ever does
            if generation == self._generation[kind]:
                self.finished.emit(
                    Outcome(
                        kind,
                        generation,
                        error=f"the simulation did not finish in {self.stuck_s:.0f} s and was "
                        "given up (a replay that never ends: please report these settings)",
                        stuck=True,
                    )
                )

    def _lane(self, kind: str) -> _Lane:
        return self._lanes["sweep" if kind == "sweep" else "sim"]

    def _run(self, lane: _Lane, kind: str, generation: int, job) -> None:
        def cancelled() -> bool:
            return self._closed or self._generation[kind] != generation

        def heartbeat() -> None:
            lane.beat = time.monotonic()

        ran_since = [time.perf_counter()]  # when this job last let the other threads in

        def between_steps() -> None:
            if cancelled():
                raise Superseded
            if time.perf_counter() - ran_since[0] >= YIELD_AFTER_S:
                time.sleep(YIELD_S)  # the GIL, to the GUI thread (see YIELD_AFTER_S)
                ran_since[0] = time.perf_counter()
            idle = self.engine_idle
            if idle is None or idle.is_set():
                return
            self._set_waiting(lane, True)
            try:
                while not idle.wait(PAUSE_POLL_S):
                    heartbeat()
                    if cancelled():
                        raise Superseded
            finally:
                self._set_waiting(lane, False)
            heartbeat()
            ran_since[0] = time.perf_counter()  # it let the others in while it waited

        if cancelled():
            return  # superseded before it started
        lane.running, lane.beat = (kind, generation), time.monotonic()
        try:
            outcome = Outcome(
                kind, generation, job(JobControl(cancelled, heartbeat, between_steps))
            )
        except Superseded:
            return
        except ValueError as e:  # settings these knobs cannot run: the panel shows why
            outcome = Outcome(kind, generation, error=str(e))
        except Exception as e:  # any other failure is reported too, never lost with the thread
            outcome = Outcome(kind, generation, error=f"{type(e).__name__}: {e}")
        if cancelled() or self._lane(kind) is not lane:
            return  # superseded, or given up as stuck (its error went out then)
        self._emit(self.finished, outcome)

    def _set_waiting(self, lane: _Lane, waiting: bool) -> None:
        """`paused` says whether any lane waits for the engine, when that changes."""
        with self._waiting_lock:
            before = bool(self._waiting)
            (self._waiting.add if waiting else self._waiting.discard)(lane)
            after = bool(self._waiting)
        if after != before:
            self._emit(self.paused, after)

    @staticmethod
    def _emit(signal, value) -> None:
        try:
            signal.emit(value)
        except RuntimeError:  # the panel (and this runner's C++ half) was deleted meanwhile
            pass
