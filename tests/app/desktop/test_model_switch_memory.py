"""Switching models in the app gives the previous model's memory back.

Three models of different sizes; the app's engine (EngineWorker on its QThread, behind an
EngineClient, tests/switch_rss_probe.py) starts on A, then switches to B, to C and back to A,
answering one chat reply on each, in a process of its own so that its RSS is its own. Back on
A it must be within 15% of its fresh start on A. Before the fix every old model stayed
resident: back on A took 153-191% of the fresh start here (898 -> 1,376 MiB, 623 -> 1,193);
after it, 101% (714 -> 720 MiB).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from repo_paths import TESTS
from sized_gguf import sized_shape, write_sized_gguf

from kvscope.engine.cpu_kernels import compile_all, kernels_compiled

PROBE = TESTS / "switch_rss_probe.py"
TOLERANCE = 1.15
# (layers, hidden, intermediate): 52, 123 and 22 MiB files, all run by the fused CPU decode.
SHAPES = {"a": (8, 1024, 2816), "b": (12, 1280, 3584), "c": (6, 768, 2048)}

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").is_file(), reason="reads RSS from /proc (Linux)"
)


def probe(*models: Path) -> list[dict]:
    root = PROBE.parent.parent
    done = subprocess.run(
        [sys.executable, str(PROBE), *map(str, models)],
        capture_output=True,
        text=True,
        timeout=300,  # a hang, not a speed limit: the probe takes 5-15 s
        cwd=root,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [line["model"] for line in lines] == list(map(str, models))
    return lines


def compile_cpu_kernels() -> None:
    """Leave numba's disk cache complete, as the app's background compile does: else the probe
    starts on torch's kernels and switches engines when its compile ends (app/desktop/
    kernel_switch.py), and a compile in the probe would stay in its RSS (LLVM's heap)."""
    if not kernels_compiled():
        compile_all(torch.get_num_threads())


def test_switching_three_times_and_back_costs_no_more_than_a_fresh_start(tmp_path):
    paths = {
        name: write_sized_gguf(tmp_path / f"{name}.gguf", sized_shape(name, *dims), seed=i)
        for i, (name, dims) in enumerate(SHAPES.items())
    }
    a, b, c = paths.values()
    compile_cpu_kernels()
    lines = probe(a, b, c, a)
    switched = [line["rss_mib"] for line in lines]
    assert all(line["layout"] == lines[0]["layout"] for line in lines), lines  # like for like
    assert "cpu-gemv" in lines[0]["layout"], lines  # numba's kernels, the fused CPU decode
    fresh, back = switched[0], switched[-1]
    figures = f"A, B, C, A: {switched} MiB"
    assert back <= fresh * TOLERANCE, (
        f"back on A takes {back / fresh:.0%} of a fresh start: {figures}"
    )
