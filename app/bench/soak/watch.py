"""What the soak watches while it runs: process figures from /proc, and the project's own remote
monitor following the hostile peer, its snapshots taken at the GUI's 4 Hz and timed (a snapshot
waits on the lock the subscriber holds while it applies a batch: that wait is a GUI stall)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from kvscope.app.bench.soak.hostile_peer import HostilePeer
from kvscope.app.remote.connection import Connection
from kvscope.app.remote.monitor import ReplicaMonitor, ReplicaSnapshot

SNAPSHOT_EVERY_S = 0.25  # the remote view's timer


def rss_mb(pid: int | str = "self") -> float | None:
    """VmRSS of a process in MiB (Linux); None where /proc is absent or the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


def open_fds(pid: int | str = "self") -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


class PeerWatch:
    """A ReplicaMonitor on the hostile peer, and a thread taking timed snapshots of it."""

    def __init__(self, peer: HostilePeer) -> None:
        connection = Connection(
            url=peer.url, kv_events=peer.pub_endpoint, kv_replay=peer.replay_endpoint
        )
        self.monitor = ReplicaMonitor(connection, poll_s=1.0)
        self._lock = threading.Lock()
        self._worst_ms = 0.0  # since the last take()
        self.worst_ms_overall = 0.0
        self.snapshots = 0
        self.failures: list[str] = []  # snapshots that raised (must stay empty)
        self.last: ReplicaSnapshot | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-snapshots", daemon=True)

    def start(self) -> PeerWatch:
        self.monitor.start()
        self._thread.start()
        return self

    def stop(self) -> dict:
        """Stops both; says whether the monitor's threads ended in time."""
        self._stop.set()
        self._thread.join(timeout=5)
        started = time.monotonic()
        self.monitor.stop(timeout=5)
        return {
            "monitor_stopped": not self.monitor.alive(),
            "monitor_stop_s": round(time.monotonic() - started, 2),
        }

    def _run(self) -> None:
        while not self._stop.wait(SNAPSHOT_EVERY_S):
            started = time.perf_counter()
            try:
                snap = self.monitor.snapshot()
            except Exception as e:  # counted and reported: a snapshot must never fail
                self.failures.append(f"{type(e).__name__}: {e}"[:200])
                continue
            ms = (time.perf_counter() - started) * 1000
            with self._lock:
                self.last = snap
                self.snapshots += 1
                self._worst_ms = max(self._worst_ms, ms)
                self.worst_ms_overall = max(self.worst_ms_overall, ms)

    def take(self) -> dict:
        """The figures since the last take(): the worst snapshot time, and the view's state."""
        with self._lock:
            worst, self._worst_ms = self._worst_ms, 0.0
            snap = self.last
        if snap is None:
            return {"snapshot_max_ms": round(worst, 1)}
        status = snap.status
        return {
            "snapshot_max_ms": round(worst, 1),
            "cached_blocks": snap.cache.num_blocks,
            "blocks_not_kept": getattr(snap.cache, "not_kept", None),
            "kv_state": status.state if status else None,
            "malformed": status.malformed if status else None,
            "missed": status.missed if status else None,
            "restarts": status.restarts if status else None,
            "http_state": snap.http_state,
            "http_error": snap.http_error[:120],
        }
