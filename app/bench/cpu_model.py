"""The CPU as /proc/cpuinfo names it, for the bench reports that compare engines on one machine
(a tok/s figure means little without the chip it ran on; platform.processor() is empty on
Linux) and for the llama.cpp peer's build (its instruction set, app/bench/llama_cpp/build.py)."""

from __future__ import annotations

import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def _first_cpu(cpuinfo: Path) -> dict[str, str]:
    """The first processor's fields (all processors list the same name and flags)."""
    fields: dict[str, str] = {}
    try:
        text = cpuinfo.read_text()
    except OSError:  # not Linux
        return fields
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_model_name(cpuinfo: Path = CPUINFO) -> str:
    """The "model name" line (e.g. Intel(R) Xeon(R) ...); platform's guess where there is none."""
    fields = _first_cpu(cpuinfo)
    for key in ("model name", "Model", "Hardware"):
        if fields.get(key):
            return fields[key]
    return platform.processor() or platform.machine() or "unknown"


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str]:
    """The instruction-set flags (avx2, avx512f, amx_bf16, ...); empty where unknown."""
    return set(_first_cpu(cpuinfo).get("flags", "").split())
