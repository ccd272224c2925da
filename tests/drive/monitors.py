"""What the long drive measures while it drives: GUI stalls, the process's RSS, and errors.

Each is its own small object so the drive's JSON says where every figure came from:
- StallMonitor: a 20 ms QTimer in the GUI thread measures its own lateness; a watcher thread
  takes the GUI thread's Python stack while a tick is overdue, so a stall names the code that
  held the thread, not only what the drive was doing.
- RssSampler: psutil's RSS every 10 s from a thread (a stalled GUI does not delay a sample).
- ErrorWatch: the window's error dialogs, failed replies and engine builds, exceptions in any
  thread, Qt's critical messages, and dialogs left open that the drive did not expect.
"""

from __future__ import annotations

import faulthandler
import os
import re
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field

import psutil
from PySide6.QtCore import QTimer, QtMsgType, qInstallMessageHandler
from PySide6.QtWidgets import QApplication, QDialog, QMessageBox

TICK_MS = 20
STALL_MS = 200  # the bound: a stall over this is logged with its cause
WATCH_S = 0.05  # the watcher's poll: a stack is taken within 50 ms of a tick falling due
MAX_STACKS = 4  # per stall: at 150 ms, then every further 200 ms of the same stall
DRIVE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(DRIVE))


class Activity:
    """What the drive is doing now, and since when: stalls and samples are labelled with it."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.log: list[tuple[float, str]] = [(0.0, "starting")]

    def now(self) -> float:
        return time.monotonic() - self.t0

    def set(self, label: str) -> None:
        self.log.append((self.now(), label))

    @property
    def current(self) -> str:
        return self.log[-1][1]

    def between(self, start: float, end: float) -> list[str]:
        """Every label current at some moment in [start, end], oldest first."""
        labels = [label for t, label in self.log if start < t <= end]
        before = [label for t, label in self.log if t <= start]
        return ([before[-1]] if before else []) + labels


def thread_stacks(scratch) -> dict[int, list[tuple[str, int, str]]]:
    """Every thread's stack, oldest frame first, as (file, line, function), by thread ident.

    Read with faulthandler, which walks the interpreter's frames in C: holding another running
    thread's frame objects (sys._current_frames) across a garbage collection crashed CPython 3.11
    here, in the GUI thread's collection."""
    scratch.seek(0)
    scratch.truncate()
    faulthandler.dump_traceback(scratch, all_threads=True)
    scratch.seek(0)
    stacks: dict[int, list[tuple[str, int, str]]] = {}
    current: list | None = None
    for line in scratch.read().decode("utf-8", "replace").splitlines():
        head = re.match(r"(?:Current thread|Thread) 0x([0-9a-f]+)", line)
        if head:
            current = stacks.setdefault(int(head.group(1), 16), [])
            continue
        frame = re.match(r'\s+File "(.*)", line (\d+) in (.*)', line)
        if frame and current is not None:
            current.insert(0, (frame.group(1), int(frame.group(2)), frame.group(3)))
    return stacks


def _short_stack(frames: list[tuple[str, int, str]]) -> list[str]:
    """The frames of this repository's code (app, engine, kernels, the drive's scenario step)
    plus the innermost three: where a stall was, readable in a JSON file."""
    ours = [f for f in frames if f[0].startswith(REPO) and "/.venv/" not in f[0]]
    drive = [f for f in ours if f[0].startswith(DRIVE)]
    # Of the drive's own frames only the scenario step matters; its loops and waits do not.
    steps = [f for f in drive if os.path.basename(f[0]) == "scenarios.py"][-1:]
    ours = [f for f in ours if f not in drive or f in steps]
    keep = [f for f in frames if f in ours or f in frames[-3:]]
    return [f"{os.path.relpath(f[0], REPO)}:{f[1]} {f[2]}" for f in keep[-14:]]


class StallMonitor:
    def __init__(self, activity: Activity) -> None:
        self.activity = activity
        self.stalls: list[dict] = []
        self.buckets = {50: 0, 100: 0, 200: 0, 500: 0, 1000: 0}  # late ticks over N ms
        self.ticks = 0
        self.max_late_ms = 0.0
        self._last = time.monotonic()
        self._stacks: list[list[str]] = []
        self._gui_ident = threading.get_ident()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.timer = QTimer(interval=TICK_MS)
        self.timer.setTimerType(self.timer.timerType().PreciseTimer)
        self.timer.timeout.connect(self._tick)
        self._scratch = tempfile.TemporaryFile()  # faulthandler writes the stacks here
        self._watcher = threading.Thread(target=self._watch, name="drive-stall-watch", daemon=True)

    def start(self) -> None:
        self._last = time.monotonic()
        self.timer.start()
        self._watcher.start()

    def stop(self) -> None:
        self.timer.stop()
        self._stop.set()
        self._watcher.join(2)

    def _tick(self) -> None:
        now = time.monotonic()
        late_ms = (now - self._last) * 1000 - TICK_MS
        with self._lock:
            stacks, self._stacks = self._stacks, []
            start, self._last = self._last, now
        self.ticks += 1
        self.max_late_ms = max(self.max_late_ms, late_ms)
        for bound in self.buckets:
            if late_ms > bound:
                self.buckets[bound] += 1
        if late_ms > STALL_MS:
            t_end = now - self.activity.t0
            self.stalls.append(
                {
                    "t_s": round(t_end, 2),
                    "late_ms": round(late_ms),
                    "doing": self.activity.between(start - self.activity.t0, t_end),
                    "stacks": stacks
                    or [
                        "none taken: the watcher thread got no turn during the stall, so the "
                        "GIL was held throughout (C code that keeps it, or another thread's)"
                    ],
                }
            )

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_S):
            with self._lock:
                overdue = time.monotonic() - self._last - TICK_MS / 1000
                due = 0.15 + 0.2 * len(self._stacks)
                if overdue < due or len(self._stacks) >= MAX_STACKS:
                    continue
            frames = thread_stacks(self._scratch)
            gui = frames.get(self._gui_ident)
            stack = _short_stack(gui) if gui else ["(no Python frame)"]
            # The other threads' innermost frames: one of them may hold the GIL the GUI waits on.
            names = {t.ident: t.name for t in threading.enumerate()}
            others = [
                f"[{names.get(ident, hex(ident))}] " + " < ".join(reversed(_short_stack(f)[-3:]))
                for ident, f in frames.items()
                if ident not in (self._gui_ident, threading.get_ident())
                and not names.get(ident, "").startswith("drive-")
            ]
            with self._lock:
                if time.monotonic() - self._last > 0.1:  # still the same stall
                    at = f"GUI thread at {overdue * 1000:.0f} ms"
                    self._stacks.append([at, *stack, "other threads:", *others])

    def summary(self) -> dict:
        return {
            "tick_ms": TICK_MS,
            "ticks": self.ticks,
            "max_late_ms": round(self.max_late_ms),
            "late_ticks_over_ms": {str(k): v for k, v in self.buckets.items()},
            "stalls_over_200ms": len(self.stalls),
        }


@dataclass
class RssSampler:
    activity: Activity
    interval_s: float = 10.0
    samples: list[dict] = field(default_factory=list)
    model: str = "bundled"  # which model the engine holds, set by the drive

    def __post_init__(self) -> None:
        self._process = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="drive-rss", daemon=True)

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sample()

    def sample(self, note: str = "") -> dict:
        rss = self._process.memory_info().rss
        row = {
            "t_s": round(self.activity.now(), 1),
            "rss_mib": round(rss / 2**20, 1),
            "threads": self._process.num_threads(),
            "model": self.model,
            "doing": self.activity.current,
        }
        if note:
            row["note"] = note
        self.samples.append(row)
        return row

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()


class ErrorWatch:
    """Collects every error a user would see or that the app raised where nobody saw it."""

    def __init__(self, activity: Activity) -> None:
        self.activity = activity
        self.errors: list[dict] = []
        self.qt_warnings: dict[str, int] = {}
        self._old_hooks = (sys.excepthook, threading.excepthook)

    def add(self, kind: str, message: str) -> None:
        self.errors.append(
            {"t_s": round(self.activity.now(), 1), "kind": kind, "doing": self.activity.current,
             "message": message[:2000]}
        )  # fmt: skip
        print(f"[drive] error ({kind}) while {self.activity.current}: {message[:300]}", flush=True)

    def install(self, window) -> None:
        window.error_shown.connect(lambda message: self.add("error dialog", message))
        window.engine_failed.connect(lambda message: self.add("engine failed", message))
        window.chats.reply_failed.connect(lambda cid, m: self.add("reply failed", f"{cid}: {m}"))
        sys.excepthook = lambda *info: self.add(
            "exception", "".join(traceback.format_exception(*info))
        )
        threading.excepthook = lambda a: self.add(
            "thread exception",
            f"{a.thread.name if a.thread else '?'}: "
            + "".join(traceback.format_exception(a.exc_type, a.exc_value, a.exc_traceback)),
        )
        qInstallMessageHandler(self._qt_message)

    def uninstall(self) -> None:
        sys.excepthook, threading.excepthook = self._old_hooks
        qInstallMessageHandler(None)

    def _qt_message(self, kind: QtMsgType, _context, message: str) -> None:
        if kind in (QtMsgType.QtCriticalMsg, QtMsgType.QtFatalMsg):
            self.add("qt critical", message)
        elif kind == QtMsgType.QtWarningMsg:
            self.qt_warnings[message[:200]] = self.qt_warnings.get(message[:200], 0) + 1

    def close_stray_dialogs(self, expected: tuple = ()) -> list[str]:
        """Dialogs open that the drive did not open: each is an error; closed so it goes on."""
        found = []
        for widget in QApplication.topLevelWidgets():
            if not isinstance(widget, QDialog) or not widget.isVisible() or widget in expected:
                continue
            text = widget.text() if isinstance(widget, QMessageBox) else ""
            line = f"{type(widget).__name__} '{widget.windowTitle()}': {text}"
            found.append(line)
            if not any(e["message"] == text[:2000] for e in self.errors):  # else counted once
                self.add("stray dialog", line)
            widget.reject()
        return found
