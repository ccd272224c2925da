"""SimulatedLoad: the simulated users while they run, one of the worker's sources of work.

Each turn admits the generator's due requests next to the chats (a prompt too long for the pool
makes that user wait, and says why), and the finished ones are reported back to it. A line about
them (submitted, running, waiting as the engine's latest snapshot lists them, done, the last
error) goes out whenever it changes. It runs on the worker's thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvscope.engine.kv.snapshot import KVSnapshot

if TYPE_CHECKING:  # the generator loads when simulated users first start
    from kvscope.app.desktop.simulated_users.loadgen import LoadGenerator
    from kvscope.engine import LLMEngine


class SimulatedLoad:
    def __init__(
        self,
        engine: Callable[[], LLMEngine | None],
        on_status: Callable[[bool, str], None],
    ) -> None:
        """`engine()`: the engine now (None: none is built); `on_status(running, line)` hears
        every change of the line."""
        self._engine = engine
        self._on_status = on_status
        self._load: LoadGenerator | None = None  # while simulated users run
        self._done = 0
        self._error = ""
        self._line = ""  # the latest line sent

    @property
    def running(self) -> bool:
        return self._load is not None

    def start(self, spec, paged: KVSnapshot | None) -> None:
        from kvscope.app.desktop.simulated_users.loadgen import LoadGenerator, fit_to_context

        self.stop()
        engine = self._engine()
        if engine is not None:  # no request may be refused for its length
            spec = fit_to_context(spec, engine.max_seq_len)
        self._load, self._done, self._error, self._line = LoadGenerator(spec), 0, "", ""
        self.report(paged)

    def stop(self) -> bool:
        """No new simulated requests; those in flight are aborted, freeing their blocks. False
        when none ran."""
        load, self._load = self._load, None
        if load is None:
            return False
        load.stop()
        engine = self._engine()
        for request_id in list(load.in_flight):
            if engine is not None:
                engine.abort_request(request_id)
            load.on_finished(request_id)
        self._on_status(False, f"stopped after {load.num_sent} requests")
        return True

    def next_arrival(self) -> float | None:
        """When the next user sends (time.monotonic()), None when none will."""
        return self._load.next_arrival() if self._load is not None else None

    def report(self, paged: KVSnapshot | None) -> None:
        """The generator's requests as the engine sees them: submitted, running, waiting (from
        the latest snapshot; a request it does not list yet waits). Sent when it changes."""
        from kvscope.app.desktop.simulated_users.loadgen import describe_progress

        load = self._load
        if load is None:
            return
        sequences = [(s.request_id, s.status) for s in paged.sequences] if paged else []
        line = f"{describe_progress(list(load.in_flight), sequences)} · {self._done} done"
        line += f" of {load.num_sent} sent"
        if self._error:
            line += f" · last error: {self._error}"
        if line != self._line:
            self._line = line
            self._on_status(True, line)

    # ---- a source of work (app/core/engine_turn.py) --------------------------------------
    def drain(self) -> None:
        engine = self._engine()
        if self._load is None or engine is None:
            return
        for request in self._load.due(time.monotonic()):
            try:
                prompt = engine.apply_chat_template(list(request.messages))
                engine.add_request(request.request_id, prompt, request.params)
            except ValueError as e:  # e.g. a prompt longer than the pool: that user waits
                self._load.on_finished(request.request_id)
                self._error = str(e)

    def deliver(self, outputs) -> None:
        load = self._load
        if load is None:
            return
        for output in outputs:
            if output.finished and output.request_id in load.in_flight:
                load.on_finished(output.request_id)
                self._done += 1

    def fail_all(self, error: Exception, engine_failed: bool = False) -> None:
        self.stop()
