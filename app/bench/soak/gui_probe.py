"""The soak's GUI leg: the desktop app's remote view open on the hostile peer, in a child
process (app/desktop/remote_view/soak_probe.py; app.bench may not import the desktop app), its
GUI thread timed by a 10 ms QTimer for the length of the load. Started with the peer, collected
after the load; the probe stops at its own deadline, and is killed PROBE_GRACE_S after it."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from kvscope.app.bench.soak.hostile_peer import HostilePeer
from kvscope.engine.child_python import python_module_command

PROBE_MODULE = "kvscope.app.desktop.remote_view.soak_probe"
PROBE_GRACE_S = 60.0  # beyond its seconds: Qt's start, the view's opening, a loaded machine
LOG_TAIL_CHARS = 600


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError:
        return ""


class GuiProbe:
    """`start()` the probe on the peer for `seconds`; `finish()` waits for it (killing it past
    its grace) and returns its figures, with how it ended."""

    def __init__(self, peer: HostilePeer, seconds: float, json_path: Path, log_path: Path) -> None:
        self.cmd = python_module_command(
            PROBE_MODULE,
            "--metrics-url",
            peer.url,
            "--kv-events",
            peer.pub_endpoint,
            "--kv-replay",
            peer.replay_endpoint,
            "--seconds",
            f"{seconds:g}",
            "--json",
            str(json_path),
        )
        self.seconds = seconds
        self.json_path, self.log_path = json_path, log_path
        self.proc: subprocess.Popen | None = None
        self.started = 0.0

    def start(self) -> GuiProbe:
        self.json_path.unlink(missing_ok=True)  # a previous run's figures are not this one's
        env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
        with self.log_path.open("wb") as log:  # the child holds its own copy of the descriptor
            self.proc = subprocess.Popen(
                self.cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        self.started = time.monotonic()
        return self

    def finish(self) -> dict:
        assert self.proc is not None, "finish() before start()"
        deadline = self.started + self.seconds + PROBE_GRACE_S
        killed = False
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            killed = True
        figures: dict = {}
        error = ""
        try:
            figures = json.loads(self.json_path.read_text())
        except (OSError, ValueError) as e:
            error = f"no figures: {type(e).__name__}: {e}"
        if killed:
            error = f"killed after {self.seconds + PROBE_GRACE_S:g} s; " + error
        return {
            "exit_status": self.proc.returncode,
            "killed": killed,
            "wall_s": round(time.monotonic() - self.started, 1),
            "error": error,
            "log_tail": _tail(self.log_path) if error or self.proc.returncode else "",
            "json_path": str(self.json_path),
            **figures,
        }
