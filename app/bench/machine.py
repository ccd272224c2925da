"""What the bench records about the machine: versions, threads, and how contended the CPU was."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import transformers

_PSI_CPU = Path("/proc/pressure/cpu")


def machine_info() -> dict:
    return {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "platform": platform.platform(),
        "processor": platform.processor(),
        "loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def cpu_stall_us() -> int | None:
    """Linux PSI: total microseconds in which some runnable task waited for a CPU.

    None where PSI is absent or disabled; it is only a diagnostic, so the bench runs without it.
    """
    try:
        some = _PSI_CPU.read_text().splitlines()[0]
    except OSError:
        return None
    return int(some.rsplit("total=", 1)[1])


class ContentionMeter:
    """Per phase: the share of its wall time in which something waited for a CPU.

    With torch's threads on every core, any other busy process makes threads wait at each parallel
    op's barrier, which can slow a step tenfold; a phase with a high share measured the neighbours.
    """

    def __init__(self) -> None:
        self.stall_share: dict[str, float | None] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        stall, start = cpu_stall_us(), time.perf_counter()
        yield
        wall, stall_end = time.perf_counter() - start, cpu_stall_us()
        if stall is None or stall_end is None or wall <= 0:
            self.stall_share[name] = None
        else:
            self.stall_share[name] = min(1.0, (stall_end - stall) / 1e6 / wall)
