"""Getting the CPU kernels ready before a model is built, so the app can say what it waits for.

Quantized weights on a CPU run numba's kernels where numba is installed (kernels/cpu_gemv.py,
engine/quant/cpu_layout.py; decode steps also kernels/cpu_decode.py). They compile the first
time on a machine (tens of seconds on a small CPU, cached on disk after that); without this the
wait would hide inside building the model's first layer."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.quant.cpu_layout import gemv_kernels, gemv_wanted
from kernels import cpu_decode, cpu_gemv

COMPILING = "Compiling the CPU kernels (once on this machine)…"


def prepare_cpu_kernels(device: str = "auto", progress: Callable[[str], None] | None = None):
    """Compile (or load from the cache) the CPU kernels a CPU engine will use; `progress`
    hears a line first when a first compile is due. Does nothing for a CUDA engine."""
    on_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if on_cuda or not gemv_wanted():
        return
    if progress is not None and not cpu_gemv.compiled_before():
        progress(COMPILING)
    if gemv_kernels() is not None:
        cpu_decode.load()  # the fused decode's glue (engine/model/cpu_decode.py)
