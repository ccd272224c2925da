"""EngineHost: the engine the worker owns, built and rebuilt, and the telemetry it shows.

The base of EngineWorker (app/desktop/engine_thread/worker.py, which handles what is asked of the
engine: replies, block queries, recording, serving, simulated users). Here: loading the model and
building the LLM, a rebuild that frees the old pool first and restores the previous engine when
the new one fails, and the telemetry (snapshots, stats, device memory) the GUI draws. Both run on
the worker thread.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref

from PySide6.QtCore import QObject, Signal, Slot

from kvscope.app.core.engine_messages import EngineInfo, Telemetry
from kvscope.app.core.settings import EngineSettings
from kvscope.app.desktop.engine_thread.kernel_switch import KernelSwitch
from kvscope.engine.kv.snapshot import KVSnapshot
from kvscope.engine.memory.device_memory import read_device_memory
from kvscope.engine.memory.host_memory import give_back_freed

logger = logging.getLogger(__name__)

TELEMETRY_INTERVAL_S = 0.1
DEVICE_MEMORY_INTERVAL_S = 0.5


class EngineHost(QObject):
    """The LLM and its telemetry; EngineWorker adds the slots that use it."""

    engine_ready = Signal(object)  # EngineInfo
    engine_failed = Signal(str)  # load / rebuild error; the previous engine (if any) stays
    busy = Signal(str)  # what the worker is doing ("" when idle between steps)
    telemetry = Signal(object)  # Telemetry
    kernel_status = Signal(str)  # the CPU kernels' background compile, "" when nothing to say

    def __init__(self, settings: EngineSettings, loaded_model=None) -> None:
        super().__init__()
        self.llm = None
        self._settings = settings
        # The model's config, tokenizer and weight source (no weights: a rebuild reads them from
        # the file again, so no host copy lingers), keyed by the settings' model path.
        self._loaded = loaded_model
        self._loaded_key = settings.model
        self._dirty = True
        self._last_publish = 0.0
        self._last_memory = 0.0
        self._device_memory: dict | None = None
        self._last_snapshots: tuple[KVSnapshot, KVSnapshot | None] | None = None
        # torch's CPU kernels while numba's compile in the background
        # (app/desktop/engine_thread/kernel_switch.py)
        self._kernels = KernelSwitch(self)
        self._kernel = "auto"  # the current engine's cpu_quant_kernel
        # Set while the engine neither builds nor has requests to step: the What-if tab's
        # simulations wait for it (app/desktop/whatif/runner.py), as a Python thread beside the
        # engine's takes the GIL back at every torch call (a 48-token reply: 1.5 s -> 9.8 s).
        self.idle = threading.Event()
        self.idle.set()

    def _mark_idle(self) -> None:
        busy = self.llm is not None and self.llm.engine.has_unfinished_requests()
        (self.idle.clear if busy else self.idle.set)()

    # ---- build and rebuild (runs in the worker thread) -------------------------------------
    def _build(self, settings: EngineSettings) -> None:
        self.idle.clear()
        try:
            self._build_now(settings)
        finally:
            self._mark_idle()

    def _build_now(self, settings: EngineSettings) -> None:
        from kvscope.engine import LLM
        from kvscope.engine.cpu_kernels import prepare_cpu_kernels
        from kvscope.engine.model.loader import load_model

        building = "Loading the model…" if self.llm is None else "Rebuilding the engine…"
        self.busy.emit(building)
        try:
            kwargs = settings.llm_kwargs()  # validates every knob before anything is freed
            if self._loaded is None or settings.model != self._loaded_key:
                # A first GGUF tokenizer conversion (30 s for Gemma 3) shows in the status line.
                loaded = load_model(settings.model, progress=self.busy.emit)
            else:
                loaded = self._loaded
        except Exception as e:  # any unreadable model file: report it, keep the old engine
            self.busy.emit("")
            self.engine_failed.emit(describe_error(e))
            return
        previous = (self._loaded, self._loaded_key, self._settings)
        self._drop_engine()  # before the new one is sized from the memory left
        failure: str | None = None
        try:
            # numba's CPU kernels where compiled (loaded from their cache in ~1 s), else torch's
            # while the compile runs in the background.
            kernel = self._kernels.kernel_for(settings.device)
            if kernel == "auto":
                prepare_cpu_kernels(settings.device, self.busy.emit)
            llm = LLM(model=loaded, **{**kwargs, "cpu_quant_kernel": kernel})
        except Exception as e:
            failure = describe_error(e)
        if failure is not None:
            # Out of the except clause: in it, the traceback's frames would hold the half-built
            # engine (its weights so far) while the previous one is built again beside it.
            self._restore(previous, failure)
            return
        self.llm, self._kernel = llm, kernel
        self._loaded, self._loaded_key, self._settings = loaded, settings.model, settings
        # Weights, tokenizer and engine live until the next rebuild. Freezing them keeps the
        # cyclic GC from rescanning them: a full collection took 300-400 ms here, and it holds
        # the GIL, which would stall the GUI thread mid-generation.
        gc.freeze()
        self._dirty = True
        self._last_snapshots = None
        self.busy.emit("")
        self.engine_ready.emit(EngineInfo.of(self.llm, settings))
        self._publish()
        self._kernels.built(self.llm, settings.device)

    def idle_for_rebuild(self) -> bool:
        """Whether a rebuild now would interrupt nothing (EngineWorker adds its activities)."""
        return self.llm is not None and not self.llm.engine.has_unfinished_requests()

    def rebuild_for_kernels(self) -> None:
        """The same settings again, on the CPU kernels compiled meanwhile (KernelSwitch)."""
        self._build(self._settings)

    def _drop_engine(self) -> None:
        """Let the engine go and give its memory back (weights, pool, buffers, tokenizer).

        Dropping the last reference frees it: no cycle holds a model or its pool
        (tests/engine/test_engine_teardown.py checks each kind), so this needs no collection, which
        matters because there must be none here: a collection on this thread can finalize the
        GUI thread's Qt objects, and PySide then deadlocks in the QObject destructor waiting
        for the GIL. The engine was frozen at build (see _build): unfrozen, so that anything
        left does get collected some day. glibc then returns the freed heap to the OS."""
        if self.llm is None:
            return
        engine = weakref.ref(self.llm.engine)
        self.llm = None
        gc.unfreeze()
        if engine() is not None:
            logger.warning(
                "the previous engine is still referenced after a rebuild: its memory stays "
                "resident until the garbage collector finds it"
            )
        give_back_freed()

    def _restore(self, previous: tuple, failure: str) -> None:
        """After a failed build: the previous engine again where there was one, and the error."""
        from kvscope.engine import LLM

        loaded, _, settings = previous
        if loaded is not None:
            try:
                kwargs = {**settings.llm_kwargs(), "cpu_quant_kernel": self._kernel}
                self.llm = LLM(model=loaded, **kwargs)
            except Exception as again:
                failure += f"\nRestoring the previous engine failed too: {describe_error(again)}"
        self.busy.emit("")
        self.engine_failed.emit(failure)
        if self.llm is not None:
            self.engine_ready.emit(EngineInfo.of(self.llm, settings))

    # ---- telemetry -----------------------------------------------------------------------
    @Slot()
    def _publish(self) -> None:
        # Every 100 ms (the telemetry timer), so that `idle` comes right within that time after
        # any path that ended requests without a step after it (a stop, a stopped server or
        # simulated users, a failed step).
        self._mark_idle()
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
        self._report_load()  # its running / waiting split follows the new snapshot

    def _report_load(self) -> None:
        """After each telemetry: EngineWorker says how its simulated users are doing."""


def describe_error(e: BaseException) -> str:
    text = str(e) or repr(e)
    return text if isinstance(e, (ValueError, FileNotFoundError)) else f"{type(e).__name__}: {text}"
