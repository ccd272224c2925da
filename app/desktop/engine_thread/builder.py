"""EngineBuilder: the engine the worker owns, built from settings and rebuilt after the old one's
memory is given back; when a build fails, the previous engine is built again.

It runs on the worker's thread and knows nothing of Qt: the worker turns its results into
signals. A model's config, tokenizer and weight source stay loaded between rebuilds with the
same model file (a rebuild reads the weights from the file again, so no host copy lingers).
"""

from __future__ import annotations

import gc
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvscope.app.core.engine_messages import EngineInfo
from kvscope.app.core.settings import EngineSettings
from kvscope.app.desktop.engine_thread.weights_progress import CountedWeights
from kvscope.engine.memory.host_memory import give_back_freed

if TYPE_CHECKING:  # the engine (torch) loads on the worker's thread, at the first build
    from kvscope.engine import LLM

logger = logging.getLogger(__name__)


@dataclass
class BuildResult:
    failure: str | None = None  # why the build failed ("" never): the user's to read
    ready: EngineInfo | None = None  # the engine now running: the new one, or the previous again


class EngineBuilder:
    def __init__(self, settings: EngineSettings, loaded_model=None) -> None:
        self.llm: LLM | None = None
        self.settings = settings  # those the running engine was built with
        self.kernel = "auto"  # the running engine's cpu_quant_kernel
        self._loaded = loaded_model  # keyed by the settings' model path
        self._loaded_key = settings.model

    @property
    def loaded(self):
        """The model (config, tokenizer, weight source) the running engine was built from."""
        return self._loaded

    def build(
        self,
        settings: EngineSettings,
        kernel_for: Callable[[str], str],
        say: Callable[[str], None],
        progress: Callable[[float], None] = lambda _share: None,
    ) -> BuildResult:
        """An engine for `settings`: the model loaded (unless it is the one loaded), the old
        engine dropped, then the new one built on `kernel_for(device)`'s CPU kernels. `say`
        hears what is happening, for the status line; `progress` the share of the weights read
        so far (0 to 1)."""
        from kvscope.engine import LLM
        from kvscope.engine.cpu_kernels import prepare_cpu_kernels
        from kvscope.engine.model.loader import load_model

        say("Loading the model…" if self.llm is None else "Rebuilding the engine…")
        try:
            kwargs = settings.llm_kwargs()  # validates every knob before anything is freed
            if self._loaded is None or settings.model != self._loaded_key:
                # A first GGUF tokenizer conversion (30 s for Gemma 3) shows in the status line.
                loaded = load_model(settings.model, progress=say)
            else:
                loaded = self._loaded
        except Exception as e:  # any unreadable model file: report it, keep the old engine
            return BuildResult(failure=describe_error(e))
        previous = (self._loaded, self.settings)
        self.drop()  # before the new one is sized from the memory left
        failure: str | None = None
        try:
            # numba's CPU kernels where compiled (loaded from their cache in ~1 s), else torch's
            # while the compile runs in the background.
            kernel = kernel_for(settings.device)
            if kernel == "auto":
                prepare_cpu_kernels(settings.device, say)
            say("Loading the weights…")
            counted = replace(loaded, weights=CountedWeights(loaded.weights, progress))
            llm = LLM(model=counted, **{**kwargs, "cpu_quant_kernel": kernel})
        except Exception as e:
            failure = describe_error(e)
        if failure is not None:
            # Out of the except clause: in it, the traceback's frames would hold the half-built
            # engine (its weights so far) while the previous one is built again beside it.
            return self._restore(previous, failure)
        self.llm, self.kernel = llm, kernel
        self._loaded, self._loaded_key, self.settings = loaded, settings.model, settings
        # Weights, tokenizer and engine live until the next rebuild. Frozen, the cyclic GC does
        # not rescan them: a full collection of them holds the GIL for long enough to stall the
        # GUI thread mid-generation.
        gc.freeze()
        return BuildResult(ready=EngineInfo.of(llm, settings))

    def drop(self) -> None:
        """Let the engine go and give its memory back (weights, pool, buffers, tokenizer).

        Dropping the last reference frees it: no cycle holds a model or its pool
        (tests/engine/test_engine_teardown.py checks each kind), so this needs no collection,
        which matters because there must be none here: a collection on this thread can finalize
        the GUI thread's Qt objects, and PySide then deadlocks in the QObject destructor waiting
        for the GIL. The engine was frozen at build: unfrozen, so that anything left does get
        collected some day. glibc then returns the freed heap to the OS."""
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

    def release(self) -> None:
        """On shutdown: the engine and the loaded model go."""
        self.llm = None
        self._loaded = None
        gc.unfreeze()

    def _restore(self, previous: tuple, failure: str) -> BuildResult:
        """After a failed build: the previous engine again where there was one, and the error."""
        from kvscope.engine import LLM

        loaded, settings = previous
        if loaded is not None:
            try:
                kwargs = {**settings.llm_kwargs(), "cpu_quant_kernel": self.kernel}
                self.llm = LLM(model=loaded, **kwargs)
            except Exception as again:
                failure += f"\nRestoring the previous engine failed too: {describe_error(again)}"
        ready = EngineInfo.of(self.llm, settings) if self.llm is not None else None
        return BuildResult(failure=failure, ready=ready)


def describe_error(e: BaseException) -> str:
    text = str(e) or repr(e)
    return text if isinstance(e, (ValueError, FileNotFoundError)) else f"{type(e).__name__}: {text}"
