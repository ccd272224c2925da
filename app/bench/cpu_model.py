"""The CPU's model name, for the bench reports that compare engines on one machine: a tok/s
figure means little without the chip it ran on (platform.processor() is empty on Linux)."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The "model name" line of /proc/cpuinfo (e.g. Intel(R) Xeon(R) ...); platform's guess
    where there is none."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return platform.processor() or platform.machine() or "unknown"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown"
