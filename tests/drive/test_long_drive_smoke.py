"""The long drive (tests/drive/long_drive.py, `make drive`) in a few seconds of each scenario.

The hour-long drive is run by hand; this keeps it working: the real window in its own process
is driven through a short loop, and the drive must exit 0 (no error dialog, failed reply or
exception), write its JSON, plot and four screenshots at their sizes, and leave no process of
its session behind, and the window must take both screenshot sizes (a widget that holds it wider
than 1024 px is an error the drive names). The model switch is left to the long drive (two
rebuilds cost ~25 s here).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = "chat,regenerate,search,export,load generator,record and replay,theme"


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def left_in_session(sid: int) -> list[str]:
    left = []
    for p in psutil.process_iter(["pid", "name"]):
        try:
            if os.getsid(p.pid) == sid:
                left.append(f"{p.pid} {p.info['name']}")
        except (ProcessLookupError, PermissionError):
            continue
    return left


@pytest.mark.slow  # ~100 s here: a whole app process, its model load and seven scenarios
def test_the_long_drive_runs_each_scenario_and_exits_cleanly(tmp_path):
    out = tmp_path / "drive"
    # The converted tokenizer and the compiled kernels kept between runs: a warm start.
    cache = Path(tempfile.gettempdir()) / "kvscope-drive-smoke-cache"
    drive = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "drive" / "long_drive.py"), "--minutes", "0",
         "--out", str(out), "--other-model", "none", "--only", SCENARIOS, "--max-tokens", "4",
         "--load-seconds", "2", "--rss-every", "2", "--cache-dir", str(cache)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own session: whatever it starts can be found after
    )  # fmt: skip
    try:
        log, _ = drive.communicate(timeout=600)  # a hang, not a speed limit
    finally:
        if drive.poll() is None:
            os.killpg(drive.pid, 9)
            drive.wait()
    assert drive.returncode == 0, log[-6000:]
    result = json.loads((out / "drive.json").read_text())
    ran = [r["scenario"] for r in result["scenarios"]]
    assert ran == SCENARIOS.split(","), ran
    assert not result["errors"], result["errors"]
    summary = result["summary"]
    assert summary["gui"]["ticks"] > 100  # the stall monitor ticked through the drive
    assert len(result["rss_samples"]) >= 3 and summary["rss"]["max_mib"] > 100
    assert result["scenarios"][0]["result"]["first"]["status"] in ("complete", "stopped")
    export = next(r for r in result["scenarios"] if r["scenario"] == "export")["result"]
    assert export["bytes"] > 0
    replay = next(r for r in result["scenarios"] if r["scenario"] == "record and replay")
    assert replay["result"]["steps"] > 0
    assert summary["exit"]["children_left"] == []
    for theme in ("dark", "light"):
        for size in ((1024, 700), (1400, 860)):
            assert png_size(out / f"shot-{theme}-{size[0]}x{size[1]}.png") == size
    assert png_size(out / "rss.png")[0] > 500
    assert left_in_session(drive.pid) == []
