"""EngineWorker: the one object that touches the engine, living in its own QThread.

The GUI talks to it through `EngineClient` (app/desktop/engine_thread/client.py) only: every
call becomes a queued signal, every answer comes back as a signal (app/core/engine_messages.py),
so the GUI thread never waits on a step. The worker's loop is a zero-interval single-shot timer
that runs one turn (app/core/engine_turn.py: drain the sources of work, step, deliver) per
event-loop turn; submits, stops, block queries and settings changes are queued events that run
between steps.

It owns its parts and calls them: the EngineBuilder (builder.py) builds and rebuilds the engine,
the TelemetryFeed (telemetry_feed.py) takes what the GUI draws, and the sources of work each
step drains and delivers to are the chats' replies (chat_replies.py), the simulated users
(simulated_load.py) and, while Engine ▸ Serve the engine runs, the server's EngineDriver.

Block tooltips are asynchronous: the GUI asks `query_block(block_id)`, the worker answers with
`block_info(block_id, contents)` from `engine.block_contents(block_id)`. The composer's context
meter is too: `count_tokens(...)` is answered by `context_usage(ContextUsage)`, counted with the
engine's own chat template and tokenizer. So is a chat's JSON Schema: `check_schema(ticket,
schema)` is answered by `schema_checked(ticket, error)`, compiled by SchemaChecks in a thread of
its own (schema_checks.py).

Recording: `start_recording(path)` has the engine write its KV events to a session file (the
engine starts one only when idle, so a replay starts from an empty pool) until
`stop_recording()`, a rebuild or shutdown; each change is answered by `recording(RecordingState)`.

Serving (Engine ▸ Serve the engine): `start_server(host, port, api_key)` runs `kvscope serve`'s
HTTP server (app/serve/) over this worker's engine. Its requests are queued to an EngineDriver
that each turn drains, so they join the chats in one batch and appear on the block map as
"api-{client}/…"; `server_state(ServerState)` answers every start and stop. A rebuild or
shutdown stops the server first.

`idle` is set while the engine neither builds nor has requests to step: the What-if tab's
simulations wait for it (app/desktop/whatif/runner.py), since a Python thread beside the
engine's takes the GIL back at every torch call. It is cleared where work arrives (a submit, a
turn's admissions) and set again by the loop and every telemetry tick.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot

from kvscope.app.core.context_fit import fit_conversation, prompt_ids, reply_reserve
from kvscope.app.core.engine_messages import ContextUsage, RecordingState, ServerState
from kvscope.app.core.engine_turn import WorkSource, run_turn
from kvscope.app.core.settings import EngineSettings
from kvscope.app.desktop.engine_thread.builder import EngineBuilder, describe_error
from kvscope.app.desktop.engine_thread.chat_replies import ChatReplies
from kvscope.app.desktop.engine_thread.kernel_switch import KernelSwitch
from kvscope.app.desktop.engine_thread.schema_checks import SchemaChecks
from kvscope.app.desktop.engine_thread.simulated_load import SimulatedLoad
from kvscope.app.desktop.engine_thread.telemetry_feed import TELEMETRY_INTERVAL_S, TelemetryFeed
from kvscope.app.desktop.simulated_users.step_speed import StepSpeed

if TYPE_CHECKING:  # the engine and the server load on the worker's thread, when first used
    from kvscope.app.serve.server import Server
    from kvscope.engine import LLM, LLMEngine

RECORD_WHEN_IDLE = (
    "Recording starts when the engine is idle: wait for the replies in flight (and stop "
    "simulated users), then press Record again."
)


class EngineWorker(QObject):
    """Owns the LLM. Create it, move it to a QThread, then drive it through its slots."""

    engine_ready = Signal(object)  # EngineInfo
    engine_failed = Signal(str)  # load / rebuild error; the previous engine (if any) stays
    busy = Signal(str)  # what the worker is doing ("" when idle between steps)
    build_progress = Signal(float)  # share of the weights a build has read, 0 to 1
    telemetry = Signal(object)  # Telemetry
    kernel_status = Signal(str)  # the CPU kernels' background compile, "" when nothing to say
    request_output = Signal(object)  # ReplyUpdate
    request_failed = Signal(str, str)  # request id, message
    block_info = Signal(int, object)  # block id, dict from engine.block_contents
    context_usage = Signal(object)  # ContextUsage, the answer to count_tokens
    schema_checked = Signal(int, object)  # ticket, "" | why the engine cannot use it | None
    error = Signal(str)  # an engine error outside any one request
    load_status = Signal(bool, str)  # simulated users running?, a line about them
    recording = Signal(object)  # RecordingState, after every start or stop
    server_state = Signal(object)  # ServerState, after every server start or stop
    speed = Signal(object)  # MachineSpeed: prefill and decode as measured here, every second
    trace_ready = Signal(object)  # engine.trace.Trace of the traffic so far; None: no engine
    _server_wake = Signal()  # from the HTTP thread: served requests are queued

    def __init__(self, settings: EngineSettings, loaded_model=None) -> None:
        super().__init__()
        self.builder = EngineBuilder(settings, loaded_model)
        self.feed = TelemetryFeed()
        self.replies = ChatReplies(self._engine, self.request_output.emit, self.request_failed.emit)
        self.load = SimulatedLoad(self._engine, self.load_status.emit)
        self.schema_checks = SchemaChecks(self.schema_checked.emit)
        # torch's CPU kernels while numba's compile in the background (kernel_switch.py)
        self._kernels = KernelSwitch(self)
        self.idle = threading.Event()
        self.idle.set()
        self._step_timer: QTimer | None = None
        self._telemetry_timer: QTimer | None = None
        self._recording_path = ""  # the session file being written, "" when not recording
        self._server: Server | None = None  # while serving this engine
        self._server_wake.connect(self._wake_for_server)
        self._speed: StepSpeed | None = None  # times this engine's steps (the load preset's)
        self._speed_of: weakref.ref[LLMEngine] | None = None  # the engine it listens to
        self._speed_sent = 0.0

    @property
    def llm(self) -> LLM | None:
        """The engine's LLM, None before the first build (or after a failed first one)."""
        return self.builder.llm

    def _engine(self) -> LLMEngine | None:
        return self.builder.llm.engine if self.builder.llm is not None else None

    def _mark_idle(self) -> None:
        busy = self.llm is not None and self.llm.engine.has_unfinished_requests()
        (self.idle.clear if busy else self.idle.set)()

    # ---- lifecycle (runs in the worker thread) -------------------------------------------
    @Slot()
    def start(self) -> None:
        self._step_timer = QTimer(self, singleShot=True, interval=0)
        self._step_timer.timeout.connect(self._step)
        self._telemetry_timer = QTimer(self, interval=int(TELEMETRY_INTERVAL_S * 1000))
        self._telemetry_timer.timeout.connect(self._publish)
        self._telemetry_timer.start()
        self._build(self.builder.settings)

    @Slot()
    def shutdown(self) -> None:
        for timer in (self._step_timer, self._telemetry_timer):
            if timer is not None:
                timer.stop()
        self.stop_server()
        self._abort_all()
        self.stop_recording()
        self.schema_checks.shutdown()
        self.builder.release()
        self.idle.set()  # nothing left to wait for
        QThread.currentThread().quit()

    @Slot(object)
    def apply_settings(self, settings: EngineSettings) -> None:
        """Rebuild the engine with new knobs; replies in flight, simulated users, a recording and
        the server stop."""
        self.stop_server("the engine was rebuilt")
        self._abort_all()
        self.stop_recording()
        self._build(settings)

    def idle_for_rebuild(self) -> bool:
        """No reply, server, recording or simulated users (a rebuild would stop them)."""
        quiet = self._server is None and not self._recording_path and not self.load.running
        busy = self.llm is None or self.llm.engine.has_unfinished_requests()
        return quiet and not self.replies and not busy

    def rebuild_for_kernels(self) -> None:
        """The same settings again, on the CPU kernels compiled meanwhile (KernelSwitch)."""
        self._build(self.builder.settings)

    def _build(self, settings: EngineSettings) -> None:
        self.idle.clear()
        try:
            result = self.builder.build(
                settings, self._kernels.kernel_for, self.busy.emit, self.build_progress.emit
            )
            self.busy.emit("")
            if result.failure is not None:
                self.engine_failed.emit(result.failure)
            if result.ready is not None:
                self.engine_ready.emit(result.ready)
            if result.failure is None:
                self.feed.restart()
                self._publish()
                self._kernels.built(self.llm, settings.device)
        finally:
            self._mark_idle()

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
        self.replies.add(request_id, dropped)
        self.feed.dirty = True
        self._mark_idle()
        self._wake()

    @Slot(str)
    def stop(self, request_id: str) -> None:
        if self.replies.stop(request_id):
            self.feed.dirty = True
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

    @Slot(int, object)
    def check_schema(self, ticket: int, schema: object) -> None:
        """Answer whether the engine can compile `schema` (a chat's JSON Schema)."""
        engine = self._engine()
        self.schema_checks.check(engine.grammars if engine is not None else None, ticket, schema)

    @Slot()
    def take_trace(self) -> None:
        """A copy of the engine's traffic trace, for the What-if tab, taken on its own thread."""
        self.trace_ready.emit(self.llm.engine.trace.trace() if self.llm is not None else None)

    def _abort_all(self) -> None:
        if self.llm is None:
            return
        self.replies.stop_all()
        self.stop_load()

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
        self.feed.dirty = True
        self.server_state.emit(ServerState("", f"The server stopped: {why}." if why else ""))

    @Slot()
    def _wake_for_server(self) -> None:
        if self._step_timer is not None and not self._step_timer.isActive():
            self._wake()

    # ---- simulated users -----------------------------------------------------------------
    @Slot(object)
    def start_load(self, spec) -> None:
        self.load.start(spec, self.feed.paged)
        self._wake()

    @Slot()
    def stop_load(self) -> None:
        """No new simulated requests; those in flight are aborted, freeing their blocks."""
        if self.load.stop():
            self.feed.dirty = True

    # ---- telemetry -----------------------------------------------------------------------
    @Slot()
    def _publish(self) -> None:
        # Every 100 ms (the telemetry timer), so that `idle` comes right within that time after
        # any path that ended requests without a step after it (a stop, a stopped server or
        # simulated users, a failed step).
        self._mark_idle()
        if self.llm is None:
            return
        telemetry = self.feed.take(self.llm)
        if telemetry is not None:
            self.telemetry.emit(telemetry)
            self.load.report(self.feed.paged)  # its running / waiting split follows the snapshot

    # ---- the loop ------------------------------------------------------------------------
    def _wake(self, delay_s: float = 0.0) -> None:
        assert self._step_timer is not None  # made by start(), the worker's first slot
        self._step_timer.start(max(0, int(delay_s * 1000)))

    def _step(self) -> None:
        if self.llm is None:
            return
        engine = self.llm.engine
        sources: list[WorkSource] = [self.replies, self.load]
        if self._server is not None:  # the HTTP clients' adds, aborts and reads
            sources.append(self._server.driver)
        speed = self._time_steps_of(engine)
        turn = run_turn(engine, sources, before_step=self._mark_idle)
        self.feed.dirty = True
        if turn.error is not None:
            self.error.emit(f"Engine step failed: {describe_error(turn.error)}")
        elif turn.stepped:
            speed.end_step(turn.seconds)
            if self.feed.due():
                self._publish()
            if time.monotonic() - self._speed_sent >= 1.0:
                self._speed_sent = time.monotonic()
                self.speed.emit(speed.speed())
        self.load.report(self.feed.paged)
        self._mark_idle()
        if engine.has_unfinished_requests():
            self._wake()
        elif (arrival := self.load.next_arrival()) is not None:
            self._wake(arrival - time.monotonic())

    def _time_steps_of(self, engine: LLMEngine) -> StepSpeed:
        """Measure this engine's steps (a new one after every rebuild); a weak reference, so
        an old engine is not kept alive by it."""
        # _speed and _speed_of are set together; testing _speed too shows the checker it is set.
        if self._speed is None or self._speed_of is None or self._speed_of() is not engine:
            self._speed = StepSpeed(engine.config.block_size)
            engine.subscribe_kv_events(self._speed.on_event)
            self._speed_of = weakref.ref(engine)
        return self._speed
