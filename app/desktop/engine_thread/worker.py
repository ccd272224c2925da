"""EngineWorker: the one object that touches the engine, living in its own QThread.

The GUI talks to it through `EngineClient` (app/desktop/engine_thread/client.py) only: every call
becomes a queued signal, every answer comes back as a signal (app/core/engine_messages.py), so the
GUI thread never waits on a step. The worker's loop is a zero-interval single-shot timer that runs
one `engine.step()` per event-loop turn; submits, stops, block queries and settings changes are
queued events that run between steps. Building and rebuilding the engine, and the telemetry,
are its base class's (EngineHost, app/desktop/engine_thread/host.py); this module handles requests.

Telemetry: at most every 100 ms, and only when the pool changed, the worker takes
`kv_snapshot()`, `shadow_snapshot()` and `stats()`; device memory is read every 500 ms. They go
out together as one `Telemetry` object (immutable copies; the GUI never reads engine state).

Block tooltips are asynchronous: the GUI asks `query_block(block_id)`, the worker answers with
`block_info(block_id, contents)` from `engine.block_contents(block_id)`. The composer's context
meter is too: `count_tokens(...)` is answered by `context_usage(ContextUsage)`, counted with the
engine's own chat template and tokenizer.

Recording: `start_recording(path)` has the engine write its KV events to a session file (the
engine starts one only when idle, so a replay starts from an empty pool) until
`stop_recording()`, a rebuild or shutdown; each change is answered by `recording(RecordingState)`.

Serving (Engine ▸ Serve the engine): `start_server(host, port, api_key)` runs `kvscope serve`'s
HTTP server (app/serve/) over this worker's engine. Its requests are queued to an EngineDriver
that this loop drains between steps, so they join the chats in one batch and appear on the block
map as "api-{client}/…"; `server_state(ServerState)` answers every start and stop. A rebuild
or shutdown stops the server first.

Simulated users (app/desktop/simulated_users/loadgen.py) run here too: each loop turn admits the
generator's due requests next to the chats, and reports their ends back to it; when the engine is
idle the loop sleeps until the next arrival. `idle` (EngineHost) is cleared where work arrives (a
submit, a step's admissions) and set again by the loop and every telemetry tick.
"""

from __future__ import annotations

import gc
import time
import weakref

from PySide6.QtCore import QThread, QTimer, Signal, Slot

from kvscope.app.core.context_fit import fit_conversation, prompt_ids, reply_reserve
from kvscope.app.core.engine_messages import (
    ContextUsage,
    RecordingState,
    ReplyUpdate,
    ServerState,
)
from kvscope.app.core.settings import EngineSettings
from kvscope.app.desktop.engine_thread.host import TELEMETRY_INTERVAL_S, EngineHost, describe_error
from kvscope.app.desktop.simulated_users.step_speed import StepSpeed

RECORD_WHEN_IDLE = (
    "Recording starts when the engine is idle: wait for the replies in flight (and stop "
    "simulated users), then press Record again."
)


class EngineWorker(EngineHost):
    """Owns the LLM. Create it, move it to a QThread, then drive it through its slots."""

    request_output = Signal(object)  # ReplyUpdate
    request_failed = Signal(str, str)  # request id, message
    block_info = Signal(int, object)  # block id, dict from engine.block_contents
    context_usage = Signal(object)  # ContextUsage, the answer to count_tokens
    error = Signal(str)  # an engine error outside any one request
    load_status = Signal(bool, str)  # simulated users running?, a line about them
    recording = Signal(object)  # RecordingState, after every start or stop
    server_state = Signal(object)  # ServerState, after every server start or stop
    speed = Signal(object)  # MachineSpeed: prefill and decode as measured here, every second
    trace_ready = Signal(object)  # engine.trace.Trace of the traffic so far; None: no engine
    _server_wake = Signal()  # from the HTTP thread: served requests are queued

    def __init__(self, settings: EngineSettings, loaded_model=None) -> None:
        super().__init__(settings, loaded_model)
        self._requests: dict[str, int] = {}  # request id -> dropped turns
        self._step_timer: QTimer | None = None
        self._telemetry_timer: QTimer | None = None
        self._load = None  # LoadGenerator while simulated users run
        self._load_done = 0
        self._load_error = ""
        self._load_line = ""  # the latest load status sent
        self._recording_path = ""  # the session file being written, "" when not recording
        self._server = None  # app.serve.server.Server while serving this engine
        self._server_wake.connect(self._wake_for_server)
        self._speed: StepSpeed | None = None  # times this engine's steps (the load preset's)
        self._speed_of = None  # a weak reference to the engine it listens to
        self._speed_sent = 0.0

    # ---- lifecycle (runs in the worker thread) -------------------------------------------
    @Slot()
    def start(self) -> None:
        self._step_timer = QTimer(self, singleShot=True, interval=0)
        self._step_timer.timeout.connect(self._step)
        self._telemetry_timer = QTimer(self, interval=int(TELEMETRY_INTERVAL_S * 1000))
        self._telemetry_timer.timeout.connect(self._publish)
        self._telemetry_timer.start()
        self._build(self._settings)

    @Slot()
    def shutdown(self) -> None:
        for timer in (self._step_timer, self._telemetry_timer):
            if timer is not None:
                timer.stop()
        self.stop_server()
        self._abort_all()
        self.stop_recording()
        self.llm = None
        self._loaded = None
        self.idle.set()  # nothing left to wait for
        gc.unfreeze()  # the engine was frozen at build (see _build); let it go now
        QThread.currentThread().quit()

    @Slot(object)
    def apply_settings(self, settings: EngineSettings) -> None:
        """Rebuild the engine with new knobs; replies in flight, simulated users, a recording and
        the server stop."""
        self.stop_server("the engine was rebuilt")
        self._abort_all()
        self.stop_recording()
        self._build(settings)

    # ---- requests ------------------------------------------------------------------------
    @Slot(str, str, object, object, str)
    def submit(
        self, request_id: str, system_prompt: str, turns: list, params: dict, policy: str
    ) -> None:
        """Start a reply to `turns` (user/assistant messages, oldest first)."""
        from kvscope.engine import SamplingParams

        if self.llm is None:
            self.request_failed.emit(request_id, "No model is loaded.")
            return
        engine = self.llm.engine
        try:
            sampling = SamplingParams(**params)
            reserve = reply_reserve(engine.max_seq_len, sampling.max_tokens)
            ids, dropped = fit_conversation(engine, system_prompt, turns, reserve, policy)
            engine.add_request(request_id, ids, sampling)
        except ValueError as e:
            self.request_failed.emit(request_id, str(e))
            return
        except Exception as e:  # anything else still ends the reply: never stuck "generating"
            self.request_failed.emit(request_id, f"could not start this reply: {describe_error(e)}")
            return
        self._requests[request_id] = dropped
        self._dirty = True
        self._mark_idle()
        self._wake()

    @Slot(str)
    def stop(self, request_id: str) -> None:
        if self.llm is None or request_id not in self._requests:
            return  # already finished: its final output is on its way
        output = self.llm.engine.abort_request(request_id)
        dropped = self._requests.pop(request_id)
        self._dirty = True
        if output is not None:
            self.request_output.emit(ReplyUpdate.from_output(output, dropped))
        self._publish()

    @Slot(int)
    def query_block(self, block_id: int) -> None:
        if self.llm is None:
            return
        try:
            self.block_info.emit(block_id, self.llm.engine.block_contents(block_id))
        except ValueError as e:  # a block id from a pool that was since rebuilt smaller
            self.block_info.emit(block_id, {"error": str(e)})

    @Slot(int, str, object, int)
    def count_tokens(self, ticket: int, system_prompt: str, turns: list, max_tokens: int) -> None:
        """Answer how many prompt tokens these turns make (an empty chat makes none)."""
        if self.llm is None:
            return
        engine = self.llm.engine
        empty = not turns and not system_prompt.strip()
        try:
            used = 0 if empty else len(prompt_ids(engine, system_prompt, turns))
        except Exception:  # a template that refuses these turns: sending them will say why
            return
        reserve = reply_reserve(engine.max_seq_len, max_tokens)
        self.context_usage.emit(ContextUsage(ticket, used, engine.max_seq_len, reserve))

    @Slot()
    def take_trace(self) -> None:
        """A copy of the engine's traffic trace, for the What-if tab, taken on its own thread."""
        self.trace_ready.emit(self.llm.engine.trace.trace() if self.llm is not None else None)

    # ---- recording -------------------------------------------------------------------------
    @Slot(str)
    def start_recording(self, path: str) -> None:
        if self.llm is None:
            self.recording.emit(RecordingState("", path, "No model is loaded."))
            return
        try:
            self.llm.engine.start_recording(path)
        except ValueError:  # the engine records from an idle pool only
            self.recording.emit(RecordingState("", path, RECORD_WHEN_IDLE))
            return
        except OSError as e:
            self.recording.emit(RecordingState("", path, f"Cannot write {path}: {e}"))
            return
        self._recording_path = path
        self.recording.emit(RecordingState(path, path))

    @Slot()
    def stop_recording(self) -> None:
        path, self._recording_path = self._recording_path, ""
        if not path:
            return
        if self.llm is not None:
            self.llm.engine.stop_recording()
        self.recording.emit(RecordingState("", path))

    # ---- serving ---------------------------------------------------------------------------
    @Slot(str, int, str)
    def start_server(self, host: str, port: int, api_key: str) -> None:
        from kvscope.app.serve.engine_loop import EngineDriver
        from kvscope.app.serve.server import Server

        self.stop_server()
        if self.llm is None:
            self.server_state.emit(ServerState("", "No model is loaded."))
            return
        driver = EngineDriver(self.llm.engine, wake=self._server_wake.emit)
        try:
            server = Server(self.llm, host=host, port=port, api_key=api_key or None, driver=driver)
            server.start()
        except (RuntimeError, ValueError, OSError) as e:
            self.server_state.emit(ServerState("", f"Cannot serve on {host}:{port}: {e}"))
            return
        self._server = server
        self.server_state.emit(ServerState(f"{server.base_url}/v1", ""))

    @Slot()
    def stop_server(self, why: str = "") -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.stop()  # fails its requests still in flight (this is the engine's thread)
        self._dirty = True
        self.server_state.emit(ServerState("", f"The server stopped: {why}." if why else ""))

    @Slot()
    def _wake_for_server(self) -> None:
        if self._step_timer is not None and not self._step_timer.isActive():
            self._wake()

    def idle_for_rebuild(self) -> bool:
        """No reply, server, recording or simulated users (a rebuild would stop them)."""
        quiet = self._server is None and not self._recording_path and self._load is None
        return quiet and not self._requests and super().idle_for_rebuild()

    def _abort_all(self) -> None:
        if self.llm is None:
            return
        for request_id in list(self._requests):
            self.stop(request_id)
        self.stop_load()

    # ---- simulated users -----------------------------------------------------------------
    @Slot(object)
    def start_load(self, spec) -> None:
        from kvscope.app.desktop.simulated_users.loadgen import LoadGenerator, fit_to_context

        self.stop_load()
        if self.llm is not None:  # no request may be refused for its length
            spec = fit_to_context(spec, self.llm.engine.max_seq_len)
        self._load, self._load_done, self._load_error = LoadGenerator(spec), 0, ""
        self._load_line = ""
        self._report_load()
        self._wake()

    @Slot()
    def stop_load(self) -> None:
        """No new simulated requests; those in flight are aborted, freeing their blocks."""
        load, self._load = self._load, None
        if load is None:
            return
        load.stop()
        for request_id in list(load.in_flight):
            if self.llm is not None:
                self.llm.engine.abort_request(request_id)
            load.on_finished(request_id)
        self._dirty = True
        self.load_status.emit(False, f"stopped after {load.num_sent} requests")

    def _admit_load(self) -> None:
        if self._load is None:
            return
        engine = self.llm.engine
        for request in self._load.due(time.monotonic()):
            try:
                prompt = engine.apply_chat_template(list(request.messages))
                engine.add_request(request.request_id, prompt, request.params)
            except ValueError as e:  # e.g. a prompt longer than the pool: that user waits
                self._load.on_finished(request.request_id)
                self._load_error = str(e)
            self._dirty = True
        self._report_load()

    def _report_load(self) -> None:
        """The generator's requests as the engine sees them: submitted, running, waiting (from
        the latest snapshot; a request it does not list yet waits). Sent when it changes."""
        from kvscope.app.desktop.simulated_users.loadgen import describe_progress

        load = self._load
        if load is None:
            return
        paged = self._last_snapshots[0] if self._last_snapshots is not None else None
        sequences = [(s.request_id, s.status) for s in paged.sequences] if paged else []
        line = f"{describe_progress(list(load.in_flight), sequences)} · {self._load_done} done"
        line += f" of {load.num_sent} sent"
        if self._load_error:
            line += f" · last error: {self._load_error}"
        if line != self._load_line:
            self._load_line = line
            self.load_status.emit(True, line)

    def _wake(self, delay_s: float = 0.0) -> None:
        self._step_timer.start(max(0, int(delay_s * 1000)))

    # ---- the loop ------------------------------------------------------------------------
    def _step(self) -> None:
        if self.llm is None:
            return
        engine = self.llm.engine
        self._admit_load()
        served = self._server.engine_loop if self._server is not None else None
        if served is not None:
            served.drain()  # the HTTP clients' adds, aborts and reads, between steps
            self._dirty = True
        self._mark_idle()
        if engine.has_unfinished_requests():
            self._time_steps_of(engine)
            started = time.perf_counter()
            try:
                outputs = engine.step()
                self._speed.end_step(time.perf_counter() - started)
            except Exception as e:  # a failing step must not kill the worker: report, clean up
                self._step_failed(e)
                return
            self._dirty = True
            for output in outputs:
                self._deliver(output)
            if served is not None:
                served.deliver(outputs)
            if time.monotonic() - self._last_publish >= TELEMETRY_INTERVAL_S:
                self._publish()
            if time.monotonic() - self._speed_sent >= 1.0:
                self._speed_sent = time.monotonic()
                self.speed.emit(self._speed.speed())
        self._mark_idle()
        if engine.has_unfinished_requests():
            self._wake()
        elif self._load is not None and self._load.next_arrival() is not None:
            self._wake(self._load.next_arrival() - time.monotonic())

    def _time_steps_of(self, engine) -> None:
        """Measure this engine's steps (a new one after every rebuild); a weak reference, so
        an old engine is not kept alive by it."""
        if self._speed_of is None or self._speed_of() is not engine:
            self._speed = StepSpeed(engine.config.block_size)
            engine.subscribe_kv_events(self._speed.on_event)
            self._speed_of = weakref.ref(engine)

    def _deliver(self, output) -> None:
        request_id = output.request_id
        if request_id in self._requests:
            errors = [c.error for c in output.outputs if c.error]
            if output.finished and errors and all(c.error for c in output.outputs):
                # The engine failed this reply alone (the others go on): say why.
                self._requests.pop(request_id)
                self.request_failed.emit(request_id, f"the engine failed this reply: {errors[0]}")
                return
            if output.finished:
                dropped = self._requests.pop(request_id)
            else:
                dropped = self._requests[request_id]
            self.request_output.emit(ReplyUpdate.from_output(output, dropped))
        elif self._load is not None and output.finished and request_id in self._load.in_flight:
            self._load.on_finished(request_id)
            self._load_done += 1
            self._report_load()

    def _step_failed(self, e: Exception) -> None:
        engine = self.llm.engine
        self.error.emit(f"Engine step failed: {describe_error(e)}")
        for request_id in list(self._requests):
            engine.abort_request(request_id)
            self._requests.pop(request_id)
            self.request_failed.emit(request_id, f"stopped by an engine error: {e}")
        self.stop_load()
        if self._server is not None:
            self._server.engine_loop.fail_all(e, engine_failed=True)
        self._dirty = True
