"""The worker's CPU kernels on a first launch: answer on torch's at once, switch to numba's later.

numba's kernels compile once per machine (~25 s on the 2-core dev machine; ~100 s to a first
reply on a slower EPYC before this). Instead of waiting, the worker's first engine is built with
torch's kernels (EngineConfig.cpu_quant_kernel="torch", 2-5x slower per token) while
engine/cpu_kernels.BackgroundCompile fills numba's disk cache in a low-priority child process.
When it is done and the engine is idle (no reply in flight, no server, recording or simulated
users, which a rebuild would stop), the worker rebuilds its engine with the same settings on
numba's kernels, loaded from the cache: about 1 s to load them plus a rebuild (2.6-3.5 s for the
bundled model here), between replies; the chats are the window's and stay. The prefix cache
starts empty again. A compile that fails keeps torch's kernels and says so.

The status line hears each step through `worker.kernel_status` (app/desktop/status_bar.py).
"""

from __future__ import annotations

import time

import torch
from PySide6.QtCore import QObject, Qt, QThread, QTimer

from kvscope.engine.cpu_kernels import BackgroundCompile, kernels_compiled, kernels_wanted

POLL_MS = 500
DONE_SHOWN_MS = 20_000  # how long the "now on the compiled kernels" line stays
# Layouts torch's kernels give quantized CPU weights that numba's layout would take instead.
TORCH_LAYOUTS = ("cpu-int4", "cpu-bf16-dense")


def compiling_line(remaining_s: float, elapsed_s: float) -> str:
    if remaining_s >= 1:
        left = f"about {remaining_s:.0f} s left"
    else:  # past the estimate: say so rather than count below zero
        left = f"{elapsed_s:.0f} s so far, longer than expected"
    return (
        f"CPU kernels compiling in the background, {left}; replies use the slower path until then"
    )


class KernelSwitch(QObject):
    """Owned by the EngineWorker, on its thread: picks each build's kernels, runs the compile."""

    def __init__(self, host, command: list[str] | None = None) -> None:
        super().__init__(host)
        self._host = host
        self._command = command  # the child's command line (tests give a failing one)
        self._compile: BackgroundCompile | None = None
        self._failed = ""
        self._timer: QTimer | None = None
        self.switches = 0

    def kernel_for(self, device: str) -> str:
        """EngineConfig.cpu_quant_kernel for the next build: numba's ("auto") once compiled or
        where none are wanted, else torch's while the compile runs."""
        if not kernels_wanted(device) or kernels_compiled():
            return "auto"
        return "torch"

    def built(self, llm, device: str) -> None:
        """After every build: start the compile where this engine runs torch's kernels for
        weights numba's would take."""
        layouts = llm.stats()["weight_layout"].split("+")
        if self._failed or not kernels_wanted(device) or kernels_compiled():
            return
        if not any(layout in TORCH_LAYOUTS for layout in layouts):
            return  # dense float32 weights, say: nothing would change
        if self._compile is None:
            self._compile = BackgroundCompile(torch.get_num_threads(), self._command)
            self._timer = QTimer(self, interval=POLL_MS)
            self._timer.timeout.connect(self._poll)
            self._timer.start()
            # The worker's thread ends at shutdown: the child goes with it (what it compiled
            # stays cached); atexit covers a host that never ran on a thread of its own.
            QThread.currentThread().finished.connect(self.stop, Qt.ConnectionType.DirectConnection)
        self._poll()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.stop()
        if self._compile is not None:
            self._compile.stop()

    def _poll(self) -> None:
        job, timer = self._compile, self._timer
        assert job is not None and timer is not None  # built() makes both before any poll
        done = job.poll()
        if done is None:
            self._say(compiling_line(job.remaining_s(), job.elapsed_s()))
            return
        if not done:
            timer.stop()
            self._failed = job.error
            self._say(
                f"The CPU kernels could not be compiled ({job.error}); replies keep the slower path"
            )
            return
        compiled_s = job.seconds
        assert compiled_s is not None  # poll() answers True only once it holds the duration
        if not self._host.idle_for_rebuild():
            self._say(
                f"CPU kernels compiled in {compiled_s:.0f} s; switching to them when the "
                "replies in flight finish"
            )
            return
        timer.stop()
        self._switch(compiled_s)

    def _switch(self, compiled_s: float) -> None:
        host = self._host
        self._say(f"CPU kernels compiled in {compiled_s:.0f} s; switching the engine to them…")
        started = time.monotonic()
        host.rebuild_for_kernels()
        took = time.monotonic() - started
        self.switches += 1
        layout = host.llm.stats()["weight_layout"] if host.llm is not None else ""
        if "cpu-gemv" in layout.split("+"):
            line = (
                f"CPU kernels compiled in {compiled_s:.0f} s; replies use them now (the switch "
                f"took {took:.1f} s)"
            )
        else:
            line = "CPU kernels compiled but could not be loaded; replies keep the slower path"
        self._say(line)
        QTimer.singleShot(DONE_SHOWN_MS, self, lambda: self._say(""))

    def _say(self, line: str) -> None:
        self._host.kernel_status.emit(line)
