"""The GUI leg of `kvscope bench --soak`: the window's Remote tab (RemoteView, its real
ReplicaMonitor) open on one replica, under QT_QPA_PLATFORM=offscreen, until N seconds after the
probe started (so it ends with the soak's load), while a 10 ms QTimer on the GUI thread records
when it could run. The longest gap between its ticks is the longest the GUI thread stood still
(a batch decoded whole, a tree drawn, a lock waited on).

    python -P -m kvscope.app.desktop.remote_view.soak_probe --metrics-url http://127.0.0.1:PORT \\
        --kv-events tcp://127.0.0.1:PORT [--kv-replay tcp://...] --seconds N --json OUT

The soak (app/bench/soak/gui_probe.py) runs it as a child process, since app.bench may not
import the desktop app. Bounded: the event loop quits at its deadline, the view then stops its
monitors in the background, and the process exits without waiting on them. Exit status 0 once
OUT is written; 2 for a connection it cannot use."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

TICK_MS = 10
STALL_MS = 250  # a gap this long is a stall a user sees
WORST_SHOWN = 20
VIEW_SIZE = (1024, 700)  # the Remote tab of a 1024 px window


class GapTimer:
    """A QTimer ticking every TICK_MS on the GUI thread; the gaps between its ticks."""

    def __init__(self) -> None:
        from PySide6.QtCore import Qt, QTimer

        self.at: list[float] = []
        self.timer = QTimer()
        self.timer.setTimerType(Qt.TimerType.PreciseTimer)
        self.timer.setInterval(TICK_MS)
        self.timer.timeout.connect(lambda: self.at.append(time.monotonic()))

    def start(self) -> GapTimer:
        self.at.append(time.monotonic())
        self.timer.start()
        return self

    def stop(self) -> dict:
        self.timer.stop()
        self.at.append(time.monotonic())  # a stall at the very end counts too
        return gap_figures(self.at)


def gap_figures(at: list[float]) -> dict:
    """Max and p99 gap between ticks (ms), how many gaps were over STALL_MS, and when the
    worst WORST_SHOWN of those began (s from the first tick: to line them up with what the peer
    sent)."""
    timed = [((b - a) * 1e3, a - at[0]) for a, b in zip(at, at[1:], strict=False)]
    gaps = sorted(g for g, _ in timed)
    if not gaps:
        return {"ticks": 0, "max_gap_ms": None, "p99_gap_ms": None, "gaps_over_250ms": 0}
    stalls = sorted((t for t in timed if t[0] > STALL_MS), reverse=True)[:WORST_SHOWN]
    p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
    return {
        "ticks": len(gaps),
        "tick_ms": TICK_MS,
        "max_gap_ms": round(gaps[-1], 1),
        "p99_gap_ms": round(p99, 1),
        "median_gap_ms": round(gaps[len(gaps) // 2], 1),
        "gaps_over_250ms": sum(g > STALL_MS for g in gaps),
        "stalls": [{"at_s": round(t, 2), "ms": round(g, 1)} for g, t in sorted(stalls, key=_at)],
    }


def _at(stall: tuple[float, float]) -> float:
    return stall[1]


def _run_events(seconds: float) -> None:
    """The event loop for `seconds`: QEventLoop, not QTest.qWait (which keeps the GIL)."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(max(0, round(seconds * 1000)), loop.quit)
    loop.exec()


def view_figures(view) -> dict:
    """What the view itself shows of its one replica: frames applied, malformed, ..."""
    polls = getattr(view, "_probe_polls", 0)
    if not view.snapshots:
        return {"replicas_shown": 0, "polls": polls}
    snap = view.snapshots[0]
    status = snap.status
    label = snap.connection.label
    return {
        "replicas_shown": len(view.snapshots),
        "polls": polls,
        "frames_applied": status.batches if status else None,
        "malformed": status.malformed if status else None,
        "missed": status.missed if status else None,
        "restarts": status.restarts if status else None,
        "recovered": status.recovered if status else None,
        "kv_state": status.state if status else None,
        "cached_blocks": snap.cache.num_blocks,
        "http_state": snap.http_state,
        "http_error": snap.http_error[:120],
        "tree_rows": len(view.roots),
        "card_status": view.status_text(label)[:200] if label in view.cards else "",
    }


def probe(url: str, kv_events: str | None, kv_replay: str | None, deadline: float) -> dict:
    """Open the view on the replica, measure until `deadline` (time.monotonic(); at least a
    second), close it; the figures."""
    from PySide6.QtGui import QGuiApplication
    from PySide6.QtWidgets import QApplication

    from kvscope.app.desktop.remote_view.view import RemoteView
    from kvscope.app.remote.connection import parse_connection
    from kvscope.app.remote.connections_qt import ConnectionList

    app = QApplication.instance() or QApplication([])
    connection = parse_connection(url, kv_events, kv_replay, name="soak peer")
    connections = ConnectionList()
    opened = time.monotonic()
    view = RemoteView(connections)
    view._probe_polls = 0  # type: ignore[attr-defined]

    def count_poll() -> None:
        view._probe_polls += 1  # type: ignore[attr-defined]

    view.timer.timeout.connect(count_poll)
    view.resize(*VIEW_SIZE)
    view.show()
    connections.add(connection)
    app.processEvents()
    open_ms = (time.monotonic() - opened) * 1e3
    ticks = GapTimer().start()
    seconds = max(1.0, deadline - time.monotonic())
    _run_events(seconds)
    gaps = ticks.stop()
    view.poll()  # the last figures, read as the view reads them
    figures = {
        "seconds": round(seconds, 1),
        "platform": QGuiApplication.platformName(),
        "open_ms": round(open_ms, 1),
        **gaps,
        "view": view_figures(view),
    }
    view.shutdown()  # its monitors stop in background threads; the process does not wait
    view.hide()
    view.deleteLater()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="soak_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--metrics-url", required=True, help="the replica's base URL")
    parser.add_argument("--kv-events", default=None, help="its ZMQ KV events endpoint")
    parser.add_argument("--kv-replay", default=None, help="its ZMQ replay endpoint")
    parser.add_argument(
        "--seconds", type=float, required=True, help="from the probe's start, Qt's included"
    )
    parser.add_argument("--json", required=True, help="where the figures go")
    started = time.monotonic()  # --seconds counts Qt's start and the view's opening
    args = parser.parse_args(argv)
    if not 0 < args.seconds <= 24 * 3600:
        parser.error(f"--seconds takes (0, 86400], got {args.seconds}")
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from kvscope.app.remote.connection import ConnectionSpecError

    try:
        figures = probe(args.metrics_url, args.kv_events, args.kv_replay, started + args.seconds)
    except ConnectionSpecError as e:
        print(f"soak_probe: {e}", file=sys.stderr)
        return 2
    Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    # os._exit: the monitors' threads stop in the background; a deadline is a deadline.
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
