"""Ctrl-C ends `kvscope` with one line and status 130 at any point (issue 43): while it still
imports torch and transformers (seconds, before main() runs), and during a long command. Real
processes and a real SIGINT: the console script and `python -m kvscope.app.cli`."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvscope.app.bench.soak.hostile_whatif import HUGE_PROMPT, write_trace

SCRIPT = Path(sys.executable).parent / "kvscope"
# importtime indents a module by its depth: kvscope.engine comes in under kvscope.app here.
ENGINE_IMPORTED = re.compile(r"\| +kvscope\.engine\n")
ENTRIES = {
    "console script": [str(SCRIPT)],
    "python -m": [sys.executable, "-m", "kvscope.app.cli"],
}


def _as_from_a_terminal() -> None:
    """The child takes SIGINT as a command run from a shell prompt does. A suite started in the
    background of a non-interactive shell (`make test &`) inherits SIGINT ignored, and Python
    then rightly leaves it ignored: Ctrl-C never reaches a background job."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(cmd: list[str], after_s: float, env: dict[str, str]) -> tuple[int, str, float]:
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=_as_from_a_terminal,  # one signal() call: takes no lock in the child
    )
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err.decode(errors="replace"), time.monotonic() - started


@pytest.mark.parametrize("entry", ENTRIES)
def test_ctrl_c_while_importing_exits_130_with_one_line(entry):
    if entry == "console script" and not SCRIPT.exists():
        pytest.skip("no kvscope console script beside this Python")
    # -X importtime's lines on stderr prove where it was: a module's line comes when its import
    # ends, so no `kvscope.engine` line means the signal came while torch was still loading.
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    for after_s in (0.6, 0.3, 0.15):  # earlier on a faster machine, until it lands mid-import
        code, err, took = _interrupt([*ENTRIES[entry], "whatif", "--help"], after_s, env)
        if not ENGINE_IMPORTED.search(err):
            break
    else:
        pytest.skip("the imports finished before every SIGINT: nothing to interrupt here")
    assert code == 130, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert err.rstrip().splitlines()[-1] == "interrupted"
    assert took < 10


@pytest.mark.parametrize("entry", ENTRIES)
def test_ctrl_c_during_a_long_whatif_exits_130_with_one_line(entry, tmp_path):
    if entry == "console script" and not SCRIPT.exists():
        pytest.skip("no kvscope console script beside this Python")
    # A 1M-token prompt a token a step: its simulation runs until its budget, seconds away.
    trace = write_trace(
        tmp_path / "long.jsonl", prompt_tokens=HUGE_PROMPT, num_blocks=HUGE_PROMPT // 16 + 64
    )
    cmd = [*ENTRIES[entry], "whatif", str(trace), "--set", "max_batched_tokens=1", "--jobs", "1"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=_as_from_a_terminal,
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # its first lines: the trace is read, the simulations start
        if line.startswith(b"cost model:"):
            break
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err_bytes = proc.communicate(timeout=60)
    err = err_bytes.decode(errors="replace")
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert "interrupted after" in err.rstrip().splitlines()[-1]
    assert time.monotonic() - started < 60
