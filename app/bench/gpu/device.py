"""The device under `kvscope bench --gpu`: how calls are timed, its peak memory bandwidth, and
the dtypes it offers. Shared by the kernel grid and the engine grid.

Kernel times are CUDA events around single calls after warmup, L2 flushed before each call,
median of the repeats (perf_counter on a CPU, where the tests run the grid small). The peak
bandwidth comes from a table of datasheet figures by device name, or a measured
device-to-device copy where the name is unknown.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable

import torch

from kvscope.engine.config import FP8_MIN_CUDA_CAPABILITY

# Datasheet memory bandwidth, GB/s; the first name fragment found in the device name wins.
PEAK_BANDWIDTH_GB_S = (
    ("GH200", 4000),
    ("H200", 4800),
    ("H100 NVL", 3938),
    ("H100 PCIe", 2000),
    ("H100", 3350),
    ("H800", 3350),
    ("A100 80GB PCIe", 1935),
    ("A100-SXM4-80GB", 2039),
    ("A100", 1555),
    ("A800", 2039),
    ("L40S", 864),
    ("L40", 864),
    ("L4", 300),
    ("A10G", 600),
    ("A10", 600),
    ("RTX 6000 Ada", 960),
    ("RTX 4090", 1008),
    ("RTX 4080", 717),
    ("RTX 3090", 936),
    ("T4", 320),
    ("V100", 900),
)
L2_FLUSH_BYTES = 256 << 20

Timer = Callable[[Callable[[], object]], float]


def call_timer(device: torch.device, iters: int, warmup: int) -> Timer:
    """Median seconds of one call: CUDA events on a GPU (L2 flushed first), perf_counter on CPU."""
    if device.type != "cuda":

        def cpu_time(fn: Callable[[], object]) -> float:
            for _ in range(warmup):
                fn()
            times = []
            for _ in range(iters):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return statistics.median(times)

        return cpu_time

    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)

    def cuda_time(fn: Callable[[], object]) -> float:
        for _ in range(warmup):
            fn()  # the first call also compiles the Triton kernel
        torch.cuda.synchronize(device)
        times = []
        for _ in range(iters):
            # K/V must come from HBM, not the previous call's L2; the GPU still busy flushing
            # also hides the host's launch latency from the events (as triton's do_bench does).
            flush.zero_()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    return cuda_time


def datasheet_bandwidth(device_name: str) -> int | None:
    """GB/s from the table for the first fragment of `device_name` it lists; None when unknown."""
    return next((gb for frag, gb in PEAK_BANDWIDTH_GB_S if frag in device_name), None)


def peak_bandwidth(device: torch.device) -> dict:
    """Datasheet peak by device name, and a measured copy (read + write) for comparison."""
    name = torch.cuda.get_device_name(device)
    table = datasheet_bandwidth(name)
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_s = call_timer(device, iters=10, warmup=2)(lambda: dst.copy_(src))
    copy_gb_s = 2 * src.numel() / copy_s / 1e9
    return {
        "device_name": name,
        "datasheet_gb_s": table,
        "copy_gb_s": copy_gb_s,
        "peak_gb_s": table if table is not None else copy_gb_s,
        "peak_source": "datasheet" if table is not None else "measured device-to-device copy",
    }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    """Give freed tensors' memory back before the next contender allocates its own."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def half_dtype(device: torch.device) -> torch.dtype:
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float16


def has_fp8(device: torch.device) -> bool:
    return (
        device.type == "cuda"
        and torch.cuda.get_device_capability(device) >= FP8_MIN_CUDA_CAPABILITY
    )
