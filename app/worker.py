"""EngineWorker: the one object that touches the engine, living in its own QThread.

The GUI talks to it through `EngineClient` only: every call becomes a queued signal, every
answer comes back as a signal, so the GUI thread never waits on a step. The worker's loop is a
zero-interval single-shot timer that runs one `engine.step()` per event-loop turn; submits,
stops, block queries and settings changes are queued events that run between steps.

Telemetry: at most every 100 ms, and only when the pool changed, the worker takes
`kv_snapshot()`, `shadow_snapshot()` and `stats()`; device memory is read every 500 ms. They go
out together as one `Telemetry` object (immutable copies; the GUI never reads engine state).

Block tooltips are asynchronous: the GUI asks `query_block(block_id)`, the worker answers with
`block_info(block_id, contents)` from `engine.block_contents(block_id)`.

Simulated users (app/loadgen.py) run here too: each loop turn admits the generator's due
requests ("load-{user}/{k}") next to the chats, and reports their ends back to it; when the
engine is idle the loop sleeps until the next arrival.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

from PySide6.QtCore import QCoreApplication, QObject, QThread, QTimer, Signal, Slot

from app.settings import EngineSettings
from engine.device_memory import read_device_memory
from engine.kv.snapshot import KVSnapshot

TELEMETRY_INTERVAL_S = 0.1
DEVICE_MEMORY_INTERVAL_S = 0.5


class ContextOverflow(ValueError):
    """A conversation does not fit the context under the chosen overflow policy."""


@dataclass(frozen=True)
class ReplyUpdate:
    """A request's progress: cumulative text of each of its n samples."""

    request_id: str
    texts: list[str]
    finish_reasons: list[str | None]
    finished: bool
    num_generated: int  # tokens over all samples
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache
    ttft_s: float | None  # arrival to first token
    tokens_per_s: float | None  # generated tokens / time since the first token
    dropped_turns: int = 0  # oldest turns left out to fit the context

    def metrics(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "generated_tokens": self.num_generated,
            "ttft_s": self.ttft_s,
            "tokens_per_s": self.tokens_per_s,
            "dropped_turns": self.dropped_turns,
            "finish_reason": self.finish_reasons[0] if self.finish_reasons else None,
        }


@dataclass(frozen=True)
class Telemetry:
    paged: KVSnapshot
    shadow: KVSnapshot | None  # the naive contiguous allocator replaying the same traffic
    stats: dict
    device_memory: dict | None
    timestamp: float = field(default_factory=time.time)


@dataclass(frozen=True)
class EngineInfo:
    """What the status bar and the settings dialog show about the running engine."""

    model_source: str
    model_name: str
    architecture: str
    num_parameters: int
    device: str
    dtype: str
    kv_dtype: str
    kv_bytes_per_token: int
    block_size: int
    num_blocks: int
    max_model_len: int
    max_seq_len: int
    settings: EngineSettings
    weight_bytes: int = 0  # as held at run time
    weight_format: str = ""  # "Q4_K+Q6_K", "int8", "float32"
    weight_layout: str = ""  # "cpu-int4", "triton", "dense", ...


def fit_conversation(
    engine, system_prompt: str, turns: list[dict], reserve: int, policy: str
) -> tuple[list[int], int]:
    """Prompt token ids for the conversation, and how many oldest turns were dropped to fit.

    A conversation fits when its prompt leaves `reserve` tokens of context for the reply.
    "stop" raises ContextOverflow; "drop_oldest" removes whole turns (a user message and the
    replies after it) from the start, never the system prompt or the newest user message.
    """
    limit = engine.max_seq_len  # max_model_len, or less when the pool is smaller
    system = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []

    def measure(kept: list[dict]) -> list[int]:
        return engine.tokenize(engine.apply_chat_template(system + kept))[1]

    ids = measure(turns)
    dropped = 0
    while len(ids) + reserve > limit:
        starts = [i for i, m in enumerate(turns) if m["role"] == "user"]
        if policy != "drop_oldest" or len(starts) < 2:
            what = "the newest message alone" if dropped or len(starts) < 2 else "this conversation"
            raise ContextOverflow(
                f"The context is full: {what} needs {len(ids)} prompt tokens plus {reserve} for "
                f"the reply, but a sequence can hold {limit} tokens (max_model_len "
                f"{engine.max_model_len}). Start a new chat, shorten the message"
                + (
                    ", or let the app drop the oldest turns (Settings)."
                    if policy == "stop"
                    else "."
                )
            )
        turns = turns[starts[1] :]
        dropped += 1
        ids = measure(turns)
    return ids, dropped


class EngineWorker(QObject):
    """Owns the LLM. Create it, move it to a QThread, then drive it through its slots."""

    engine_ready = Signal(object)  # EngineInfo
    engine_failed = Signal(str)  # load / rebuild error; the previous engine (if any) stays
    busy = Signal(str)  # what the worker is doing ("" when idle between steps)
    request_output = Signal(object)  # ReplyUpdate
    request_failed = Signal(str, str)  # request id, message
    telemetry = Signal(object)  # Telemetry
    block_info = Signal(int, object)  # block id, dict from engine.block_contents
    error = Signal(str)  # an engine error outside any one request
    load_status = Signal(bool, str)  # simulated users running?, a line about them

    def __init__(self, settings: EngineSettings, loaded_model=None) -> None:
        super().__init__()
        self.llm = None
        self._settings = settings
        # The model's config, tokenizer and weight source (no weights: a rebuild reads them from
        # the file again, so no host copy lingers), keyed by the settings' model path.
        self._loaded = loaded_model
        self._loaded_key = settings.model
        self._requests: dict[str, int] = {}  # request id -> dropped turns
        self._dirty = True
        self._last_publish = 0.0
        self._last_memory = 0.0
        self._device_memory: dict | None = None
        self._last_snapshots: tuple[KVSnapshot, KVSnapshot | None] | None = None
        self._step_timer: QTimer | None = None
        self._telemetry_timer: QTimer | None = None
        self._load = None  # LoadGenerator while simulated users run
        self._load_done = 0
        self._load_error = ""

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
        self._abort_all()
        self.llm = None
        self._loaded = None
        gc.unfreeze()  # the engine was frozen at build (see _build); let it go now
        QThread.currentThread().quit()

    @Slot(object)
    def apply_settings(self, settings: EngineSettings) -> None:
        """Rebuild the engine with new knobs; replies in flight and simulated users stop."""
        self._abort_all()
        self._build(settings)

    def _build(self, settings: EngineSettings) -> None:
        from engine import LLM
        from engine.model.loader import load_model

        self.busy.emit("Loading the model…" if self.llm is None else "Rebuilding the engine…")
        try:
            kwargs = settings.llm_kwargs()  # validates every knob before anything is freed
            if self._loaded is None or settings.model != self._loaded_key:
                loaded = load_model(settings.model)
            else:
                loaded = self._loaded
        except Exception as e:  # any unreadable model file: report it, keep the old engine
            self.busy.emit("")
            self.engine_failed.emit(_describe(e))
            return
        previous = (self._loaded, self._loaded_key, self._settings)
        # Free the old pool before sizing the new one (on a GPU the new one is sized from what
        # is left): dropping the last reference frees it, no cycle holds it. No gc.collect()
        # here: a collection on this thread can finalize the GUI thread's Qt objects, and
        # PySide then deadlocks in the QObject destructor waiting for the GIL.
        self.llm = None
        gc.unfreeze()
        try:
            llm = LLM(model=loaded, **kwargs)
        except Exception as e:
            message = _describe(e)
            self.llm = None
            if previous[0] is not None:
                try:
                    self.llm = LLM(model=previous[0], **previous[2].llm_kwargs())
                except Exception as again:
                    message += f"\nRestoring the previous engine failed too: {_describe(again)}"
            self.busy.emit("")
            self.engine_failed.emit(message)
            if self.llm is not None:
                self.engine_ready.emit(self._info(previous[2]))
            return
        self.llm = llm
        self._loaded, self._loaded_key, self._settings = loaded, settings.model, settings
        # Weights, tokenizer and engine live until the next rebuild. Freezing them keeps the
        # cyclic GC from rescanning them: a full collection took 300-400 ms here, and it holds
        # the GIL, which would stall the GUI thread mid-generation.
        gc.freeze()
        self._dirty = True
        self._last_snapshots = None
        self.busy.emit("")
        self.engine_ready.emit(self._info(settings))
        self._publish()

    def _info(self, settings: EngineSettings) -> EngineInfo:
        from app.model_picker import count_parameters
        from engine import planner

        engine = self.llm.engine
        mc = engine.model_config
        config = engine.config
        kv_dtype = planner.dtype_name(config.kv_torch_dtype)
        kv_bytes = planner.bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim, kv_dtype)
        stats = self.llm.stats()
        return EngineInfo(
            model_source=str(engine.model_source),
            model_name=mc.name or str(engine.model_source),
            architecture=mc.architecture,
            num_parameters=count_parameters(mc),
            device=str(config.torch_device),
            dtype=str(config.torch_dtype).removeprefix("torch."),
            kv_dtype=kv_dtype,
            kv_bytes_per_token=kv_bytes,
            block_size=config.block_size,
            num_blocks=stats["kv_blocks_total"],
            max_model_len=engine.max_model_len,
            max_seq_len=engine.max_seq_len,
            settings=settings,
            weight_bytes=stats["weight_bytes"],
            weight_format=stats["weight_format"],
            weight_layout=stats["weight_layout"],
        )

    # ---- requests ------------------------------------------------------------------------
    @Slot(str, str, object, object, str)
    def submit(
        self, request_id: str, system_prompt: str, turns: list, params: dict, policy: str
    ) -> None:
        """Start a reply to `turns` (user/assistant messages, oldest first)."""
        from engine import SamplingParams

        if self.llm is None:
            self.request_failed.emit(request_id, "No model is loaded.")
            return
        engine = self.llm.engine
        try:
            sampling = SamplingParams(**params)
            reserve = min(sampling.max_tokens, max(1, engine.max_seq_len // 4))
            ids, dropped = fit_conversation(engine, system_prompt, turns, reserve, policy)
            engine.add_request(request_id, ids, sampling)
        except ValueError as e:
            self.request_failed.emit(request_id, str(e))
            return
        except Exception as e:  # anything else still ends the reply: never stuck "generating"
            self.request_failed.emit(request_id, f"could not start this reply: {_describe(e)}")
            return
        self._requests[request_id] = dropped
        self._dirty = True
        self._wake()

    @Slot(str)
    def stop(self, request_id: str) -> None:
        if self.llm is None or request_id not in self._requests:
            return  # already finished: its final output is on its way
        output = self.llm.engine.abort_request(request_id)
        dropped = self._requests.pop(request_id)
        self._dirty = True
        if output is not None:
            self.request_output.emit(_update(output, dropped))
        self._publish()

    @Slot(int)
    def query_block(self, block_id: int) -> None:
        if self.llm is None:
            return
        try:
            self.block_info.emit(block_id, self.llm.engine.block_contents(block_id))
        except ValueError as e:  # a block id from a pool that was since rebuilt smaller
            self.block_info.emit(block_id, {"error": str(e)})

    def _abort_all(self) -> None:
        if self.llm is None:
            return
        for request_id in list(self._requests):
            self.stop(request_id)
        self.stop_load()

    # ---- simulated users -----------------------------------------------------------------
    @Slot(object)
    def start_load(self, spec) -> None:
        from app.loadgen import LoadGenerator

        self.stop_load()
        self._load, self._load_done, self._load_error = LoadGenerator(spec), 0, ""
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
        load = self._load
        if load is not None:
            line = (
                f"{load.num_sent} sent · {len(load.in_flight)} in flight · {self._load_done} done"
            )
            self.load_status.emit(
                True, line + (f" · last error: {self._load_error}" if self._load_error else "")
            )

    def _wake(self, delay_s: float = 0.0) -> None:
        self._step_timer.start(max(0, int(delay_s * 1000)))

    # ---- the loop ------------------------------------------------------------------------
    def _step(self) -> None:
        if self.llm is None:
            return
        engine = self.llm.engine
        self._admit_load()
        if engine.has_unfinished_requests():
            try:
                outputs = engine.step()
            except Exception as e:  # a failing step must not kill the worker: report, clean up
                self._step_failed(e)
                return
            self._dirty = True
            for output in outputs:
                self._deliver(output)
            if time.monotonic() - self._last_publish >= TELEMETRY_INTERVAL_S:
                self._publish()
        if engine.has_unfinished_requests():
            self._wake()
        elif self._load is not None and self._load.next_arrival() is not None:
            self._wake(self._load.next_arrival() - time.monotonic())

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
            self.request_output.emit(_update(output, dropped))
        elif self._load is not None and output.finished and request_id in self._load.in_flight:
            self._load.on_finished(request_id)
            self._load_done += 1
            self._report_load()

    def _step_failed(self, e: Exception) -> None:
        engine = self.llm.engine
        self.error.emit(f"Engine step failed: {_describe(e)}")
        for request_id in list(self._requests):
            engine.abort_request(request_id)
            self._requests.pop(request_id)
            self.request_failed.emit(request_id, f"stopped by an engine error: {e}")
        self.stop_load()
        self._dirty = True

    @Slot()
    def _publish(self) -> None:
        if self.llm is None:
            return
        now = time.monotonic()
        memory_due = now - self._last_memory >= DEVICE_MEMORY_INTERVAL_S
        if not (self._dirty or memory_due):
            return
        if memory_due:
            self._last_memory = now
            self._device_memory = read_device_memory().to_dict()
        if self._dirty or self._last_snapshots is None:
            engine = self.llm.engine
            self._last_snapshots = (engine.kv_snapshot(), engine.shadow_snapshot())
            self._dirty = False
        self._last_publish = now
        paged, shadow = self._last_snapshots
        self.telemetry.emit(Telemetry(paged, shadow, self.llm.stats(), self._device_memory))


def _update(output, dropped: int) -> ReplyUpdate:
    texts = [c.text for c in output.outputs]
    generated = sum(len(c.token_ids) for c in output.outputs)
    m = output.metrics
    ttft = tps = None
    if m is not None and m.first_token_time is not None:
        ttft = max(0.0, m.first_token_time - m.arrival_time)
        end = m.finished_time or time.time()
        if end > m.first_token_time and generated > len(output.outputs):
            # The first token of each sample came with the prompt; the rest are decode.
            tps = (generated - len(output.outputs)) / (end - m.first_token_time)
    return ReplyUpdate(
        request_id=output.request_id,
        texts=texts,
        finish_reasons=[c.finish_reason for c in output.outputs],
        finished=output.finished,
        num_generated=generated,
        prompt_tokens=len(output.prompt_token_ids),
        cached_tokens=output.num_cached_tokens,
        ttft_s=ttft,
        tokens_per_s=tps,
        dropped_turns=dropped,
    )


def _describe(e: BaseException) -> str:
    text = str(e) or repr(e)
    return text if isinstance(e, (ValueError, FileNotFoundError)) else f"{type(e).__name__}: {text}"


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
    _start_load = Signal(object)
    _stop_load = Signal()
    _shutdown = Signal()

    def __init__(self, settings: EngineSettings, loaded_model=None, parent=None) -> None:
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("kvscope-engine")
        self.worker = EngineWorker(settings, loaded_model)
        self.worker.moveToThread(self.thread)
        self._start.connect(self.worker.start)
        self._submit.connect(self.worker.submit)
        self._stop.connect(self.worker.stop)
        self._apply.connect(self.worker.apply_settings)
        self._query_block.connect(self.worker.query_block)
        self._start_load.connect(self.worker.start_load)
        self._stop_load.connect(self.worker.stop_load)
        self._shutdown.connect(self.worker.shutdown)
        # Re-exported: connecting to these from the GUI thread gets queued delivery.
        w = self.worker
        self.engine_ready, self.engine_failed, self.busy = w.engine_ready, w.engine_failed, w.busy
        self.request_output, self.request_failed = w.request_output, w.request_failed
        self.telemetry, self.block_info, self.error = w.telemetry, w.block_info, w.error
        self.load_status = w.load_status

    def start(self) -> None:
        _RUNNING.add(self)
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)
        self.thread.start()
        self._start.emit()

    def submit(
        self, request_id: str, system_prompt: str, turns: list[dict], params: dict, policy: str
    ) -> None:
        self._submit.emit(request_id, system_prompt, turns, params, policy)

    def stop(self, request_id: str) -> None:
        self._stop.emit(request_id)

    def apply_settings(self, settings: EngineSettings) -> None:
        self._apply.emit(settings)

    def query_block(self, block_id: int) -> None:
        self._query_block.emit(block_id)

    def start_load(self, spec) -> None:
        """Start simulated users (an app.loadgen.LoadSpec)."""
        self._start_load.emit(spec)

    def stop_load(self) -> None:
        self._stop_load.emit()

    def shutdown(self, timeout_ms: int = 60_000) -> None:
        if self.thread.isRunning():
            self._shutdown.emit()
            if not self.thread.wait(timeout_ms):
                return  # mid-step still: stays registered, so it is not destroyed running
        _RUNNING.discard(self)
