"""EngineClient: the GUI thread's handle on the engine worker and the thread it runs in.

Its methods post queued signals to the worker and return at once; the worker's signals, which it
re-exports, answer on the GUI thread when connected to a bound method of a GUI-thread object.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QCoreApplication, QObject, QThread, Signal

from kvscope.app.core.settings import EngineSettings
from kvscope.app.desktop.engine_thread.worker import EngineWorker

_RUNNING: set[EngineClient] = set()  # clients whose thread runs: a QThread must outlive its run


class EngineClient(QObject):
    """The GUI thread's handle on the worker: methods that post, signals that answer.

    Call `shutdown()` when done (the window does on close; quitting the app does too). Until
    then the client is kept alive here even if its owner is dropped: Qt aborts the process when
    a running QThread is destroyed.
    """

    _start = Signal()
    _submit = Signal(str, str, object, object, str)
    _stop = Signal(str)
    _apply = Signal(object)
    _query_block = Signal(int)
    _count_tokens = Signal(int, str, object, int)
    _check_schema = Signal(int, object)
    _start_recording = Signal(str)
    _stop_recording = Signal()
    _start_load = Signal(object)
    _stop_load = Signal()
    _start_server = Signal(str, int, str)
    _stop_server = Signal()
    _take_trace = Signal()
    _shutdown = Signal()

    def __init__(self, settings: EngineSettings, loaded_model=None, parent=None) -> None:
        super().__init__(parent)
        # Not `thread`: that would hide QObject.thread(), the thread this client lives in.
        self.engine_thread = QThread()
        self.engine_thread.setObjectName("kvscope-engine")
        self.worker = EngineWorker(settings, loaded_model)
        self.worker.moveToThread(self.engine_thread)
        self._start.connect(self.worker.start)
        self._submit.connect(self.worker.submit)
        self._stop.connect(self.worker.stop)
        self._apply.connect(self.worker.apply_settings)
        self._query_block.connect(self.worker.query_block)
        self._count_tokens.connect(self.worker.count_tokens)
        self._check_schema.connect(self.worker.check_schema)
        self._start_recording.connect(self.worker.start_recording)
        self._stop_recording.connect(self.worker.stop_recording)
        self._start_load.connect(self.worker.start_load)
        self._stop_load.connect(self.worker.stop_load)
        self._start_server.connect(self.worker.start_server)
        self._stop_server.connect(self.worker.stop_server)
        self._take_trace.connect(self.worker.take_trace)
        self._shutdown.connect(self.worker.shutdown)
        # Re-exported: connecting to these from the GUI thread gets queued delivery.
        w = self.worker
        self.engine_ready, self.engine_failed, self.busy = w.engine_ready, w.engine_failed, w.busy
        self.request_output, self.request_failed = w.request_output, w.request_failed
        self.telemetry, self.block_info, self.error = w.telemetry, w.block_info, w.error
        self.load_status, self.context_usage = w.load_status, w.context_usage
        self.schema_checked = w.schema_checked  # the answer to check_schema
        self.recording = w.recording
        self.kernel_status = w.kernel_status  # the CPU kernels' background compile
        self.build_progress = w.build_progress  # share of the weights a build has read
        self.server_state = w.server_state
        self.speed = w.speed
        self.trace_ready = w.trace_ready  # the answer to take_trace

    @property
    def engine_idle(self) -> threading.Event:
        """Set while the engine neither builds nor has requests to step (any thread may wait
        on it): the What-if tab's simulations run only then."""
        return self.worker.idle

    def start(self) -> None:
        _RUNNING.add(self)
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)
        self.engine_thread.start()
        self._start.emit()

    def submit(
        self, request_id: str, system_prompt: str, turns: list[dict], params: dict, policy: str
    ) -> None:
        self._work_coming()
        self._submit.emit(request_id, system_prompt, turns, params, policy)

    def _work_coming(self) -> None:
        """The What-if tab's simulations stop here, not once the worker gets to the request,
        so its path to the first step (template, tokens) does not share the GIL with them
        (PERFORMANCE.md, "What-if beside the engine"). The worker sets the event again once
        nothing runs (within its 100 ms telemetry tick at the latest)."""
        self.worker.idle.clear()

    def stop(self, request_id: str) -> None:
        self._stop.emit(request_id)

    def apply_settings(self, settings: EngineSettings) -> None:
        self._work_coming()
        self._apply.emit(settings)

    def query_block(self, block_id: int) -> None:
        self._query_block.emit(block_id)

    def count_tokens(
        self, ticket: int, system_prompt: str, turns: list[dict], max_tokens: int
    ) -> None:
        """Ask how many prompt tokens these turns make; answered by `context_usage`."""
        self._count_tokens.emit(ticket, system_prompt, turns, max_tokens)

    def check_schema(self, ticket: int, schema: object) -> None:
        """Ask whether the engine can use this JSON Schema; answered by `schema_checked`."""
        self._check_schema.emit(ticket, schema)

    def start_recording(self, path: str) -> None:
        """Record the engine's KV events to `path`; answered by `recording`."""
        self._start_recording.emit(path)

    def stop_recording(self) -> None:
        self._stop_recording.emit()

    def start_load(self, spec) -> None:
        """Start simulated users (an app.desktop.simulated_users.loadgen.LoadSpec)."""
        self._work_coming()
        self._start_load.emit(spec)

    def stop_load(self) -> None:
        self._stop_load.emit()

    def start_server(self, host: str, port: int, api_key: str = "") -> None:
        """Serve this engine over the OpenAI API; answered by `server_state`."""
        self._start_server.emit(host, port, api_key)

    def stop_server(self) -> None:
        self._stop_server.emit()

    def take_trace(self) -> None:
        """Ask for the engine's traffic trace (the What-if tab); answered by `trace_ready`."""
        self._take_trace.emit()

    def shutdown(self, timeout_ms: int = 60_000) -> None:
        if self.engine_thread.isRunning():
            self._shutdown.emit()
            if not self.engine_thread.wait(timeout_ms):
                return  # mid-step still: stays registered, so it is not destroyed running
        _RUNNING.discard(self)
