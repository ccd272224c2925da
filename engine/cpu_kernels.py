"""Getting the CPU kernels ready before a model is built, so the app can say what it waits for.

Quantized weights on a CPU run numba's kernels where numba is installed (kernels/cpu_gemv.py,
engine/quant/cpu_layout.py; decode steps also kernels/cpu_decode.py). They compile the first
time on a machine (~25 s on the 2-core dev machine, cached on disk after that); without this the
wait would hide inside building the model's first layer.

The command line waits for them (`prepare_cpu_kernels`). The app does not: its first engine runs
torch's kernels (EngineConfig.cpu_quant_kernel="torch") while `BackgroundCompile` fills numba's
disk cache in a separate low-priority process (`python -m kvscope.engine.cpu_kernels --compile`): a
compile holds the GIL for seconds at a time, which in-process would stall the window. When it
is done the app rebuilds its engine on numba's kernels, loaded from that cache in ~1 s
(app/desktop/engine_thread/kernel_switch.py). A marker file in the cache says every kernel is in it;
the compile's duration is kept beside the cache to estimate the next one.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from kvscope.engine.child_python import python_module_command
from kvscope.engine.quant.cpu_layout import gemv_kernels, gemv_wanted
from kvscope.kernels import cpu_decode, cpu_gemv

__all__ = ["BackgroundCompile", "kernels_compiled", "kernels_wanted", "prepare_cpu_kernels"]

COMPILING = "Compiling the CPU kernels (once on this machine)…"
MARKER = cpu_gemv.COMPLETE_MARKER  # in the cache folder: every kernel below is in it
TIMES = "kvscope-compile-seconds.json"  # beside the folders: outlives a version of the sources
# With no compile measured on this machine yet, seconds from start to done by usable cores.
# Measured on the 2-core dev VM: 3 s to start the process, 16 s cpu_gemv, 6 s cpu_decode, 2 s
# the projections, with the app answering on the other core; one core shares it with the app.
DEFAULT_COMPILE_S = {1: 60.0, 2: 30.0}
MANY_CORES_COMPILE_S = 25.0
MAX_COMPILE_S = 900.0  # past this a compile counts as failed (a wedged LLVM, a swapping machine)
FROZEN_FLAG = "--compile-cpu-kernels"  # the installed app's executable runs the compile itself
# How far the child yields to other work, 0-19 (POSIX nice). 19 by default: the user's work and
# the app's own replies come first, so on a machine with every core busy the compile waits.
NICE_ENV = "KVSCOPE_COMPILE_NICE"

logger = logging.getLogger(__name__)


def kernels_wanted(device: str = "auto") -> bool:
    """Whether an engine on `device` would run numba's kernels for quantized weights."""
    on_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return not on_cuda and gemv_wanted()


def prepare_cpu_kernels(
    device: str = "auto", progress: Callable[[str], None] | None = None
) -> None:
    """Compile (or load from the cache) the CPU kernels a CPU engine will use; `progress`
    hears a line first when a first compile is due. Does nothing for a CUDA engine."""
    if not kernels_wanted(device):
        return
    if progress is not None and not cpu_gemv.compiled_before():
        progress(COMPILING)
    if gemv_kernels() is not None:
        cpu_decode.load()  # the fused decode's glue (engine/model/cpu_decode.py)


def numba_dir() -> Path:
    """numba's cache folder for these kernels, as cpu_gemv.load() sets it."""
    return Path(os.environ.get("NUMBA_CACHE_DIR") or cpu_gemv.cache_dir())


def kernels_compiled() -> bool:
    """Every kernel `compile_all` compiles is in numba's disk cache (each then loads on its
    first call)."""
    return cpu_gemv.cache_complete()


def compile_all(threads: int) -> None:
    """Compile into numba's disk cache every kernel an engine on `threads` threads may call,
    then write the marker; raises RuntimeError where numba cannot compile here."""
    torch.set_num_threads(threads)  # the warm-ups compile the parallel entries only past 1
    said = _Said()  # the loads log why they gave up, and return None
    for name in ("kvscope.kernels.cpu_gemv", "kvscope.kernels.cpu_decode"):
        logging.getLogger(name).addHandler(said)
    try:
        ns = cpu_gemv.load()
        decode = cpu_decode.load() if ns is not None else None
    finally:
        for name in ("kvscope.kernels.cpu_gemv", "kvscope.kernels.cpu_decode"):
            logging.getLogger(name).removeHandler(said)
    if decode is None:
        raise RuntimeError(said.last or "numba's CPU kernels do not compile here")
    _warm_projections(decode, threads)
    marker = numba_dir() / MARKER
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"threads": threads}), encoding="utf-8")


class _Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.last = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.last = record.getMessage()


def _warm_projections(ns: SimpleNamespace, threads: int) -> None:
    """The fused decode's matmul entries for every kind of matrix (4- and 8-bit codes, each
    pair of scale and offset types: cpu_gemv.meta_examples): engine/model/cpu_decode.py warms
    those its model has at build."""
    chunks, tiles, k, group = 1, 1, 64, 32
    tables = [ns.project] + ([ns.project_parallel] if threads > 1 else [])
    for bits in (4, 8):
        if bits == 4:
            codes = np.zeros((chunks, tiles, k // 32, 256), np.uint8)
        else:
            codes = np.zeros((chunks, tiles, k // group, 16 * group), np.int8)
        for scale, low in cpu_gemv.meta_examples(bits, (chunks, tiles, k // group, 16)):
            xq = np.zeros((1, k), np.int8)
            xd, xs = np.zeros((1, k // group), np.float32), np.zeros((1, k // group), np.float32)
            y = np.zeros((1, 16 * tiles), np.float32)
            for table in tables:
                table[bits](codes, scale, low, group, 16 * tiles, xq, xd, xs, y, 0)


def expected_compile_s() -> float:
    """The previous compile's duration on this machine, else the figure for its core count."""
    try:
        return float(json.loads((numba_dir().parent / TIMES).read_text(encoding="utf-8"))["s"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return DEFAULT_COMPILE_S.get(cores or 1, MANY_CORES_COMPILE_S)


def compile_command(threads: int) -> list[str]:
    if getattr(sys, "frozen", False):  # packaging/kvscope_main.py dispatches the flag
        return [sys.executable, FROZEN_FLAG, "--threads", str(threads)]
    return python_module_command(
        "kvscope.engine.cpu_kernels", "--compile", "--threads", str(threads)
    )


_RUNNING: weakref.WeakSet[BackgroundCompile] = weakref.WeakSet()


class BackgroundCompile:
    """`compile_all` in a child process at low priority; `poll()` says how it went."""

    def __init__(self, threads: int, command: list[str] | None = None) -> None:
        self.estimate_s = expected_compile_s()
        self.error = ""
        self.seconds: float | None = None  # the duration, once it succeeded
        self._log = tempfile.TemporaryFile()  # a file, not a pipe: a full pipe would block it
        env = {**os.environ, "NUMBA_CACHE_DIR": str(numba_dir())}
        flags = 0
        if sys.platform == "win32":  # below normal: users' machines are busy
            flags = subprocess.BELOW_NORMAL_PRIORITY_CLASS | subprocess.CREATE_NO_WINDOW
        self.started = time.monotonic()
        self._process = subprocess.Popen(
            command or compile_command(threads),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            env=env,
            creationflags=flags,
        )
        _RUNNING.add(self)

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def remaining_s(self) -> float:
        return max(0.0, self.estimate_s - self.elapsed_s())

    def poll(self) -> bool | None:
        """None while compiling; True once done (its duration kept for the next estimate);
        False when it failed or ran past MAX_COMPILE_S (`error` says why)."""
        if self.seconds is not None:
            return True
        if self.error:
            return False
        code = self._process.poll()
        if code is None:
            if self.elapsed_s() < MAX_COMPILE_S:
                return None
            self.stop()
            self.error = f"still compiling after {MAX_COMPILE_S:.0f} s"
            return False
        if code == 0 and kernels_compiled():
            self.seconds = self.elapsed_s()
            _record_seconds(self.seconds)
            return True
        self.error = self._last_line() or f"the compile exited with status {code}"
        return False

    def stop(self) -> None:
        """End the child (what it compiled so far stays cached for the next start)."""
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def _last_line(self) -> str:
        self._log.seek(0)
        lines = self._log.read().decode("utf-8", "replace").strip().splitlines()
        return lines[-1].strip() if lines else ""


def _record_seconds(seconds: float) -> None:
    path = numba_dir().parent / TIMES
    try:
        path.write_text(json.dumps({"s": round(seconds, 1)}), encoding="utf-8")
    except OSError as e:  # the estimate falls back to the per-core figure
        logger.warning("cannot record the compile time in %s: %s", path, e)


@atexit.register
def _stop_running() -> None:
    for job in list(_RUNNING):
        job.stop()


def compile_niceness() -> int:
    try:
        return min(19, max(0, int(os.environ.get(NICE_ENV, "19"))))
    except ValueError:
        return 19


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvscope.engine.cpu_kernels")
    parser.add_argument("--compile", action="store_true", help="fill numba's disk cache")
    parser.add_argument("--threads", type=int, default=1, help="the engine's CPU threads")
    args = parser.parse_args(argv)
    if hasattr(os, "nice"):
        os.nice(compile_niceness())
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    started = time.monotonic()
    try:
        compile_all(max(1, args.threads))
    except Exception as e:  # the parent reports the last line of stderr
        print(
            str(e) if isinstance(e, RuntimeError) else f"{type(e).__name__}: {e}", file=sys.stderr
        )
        return 1
    print(f"CPU kernels compiled in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
