"""The drive inside Qt: the window as launch.py builds it, the scenario loop, the screenshots,
Chat ▸ Quit, then the results. Imported by long_drive.py once the environment (display, data folder)
is set, since Qt reads it at import.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

import psutil
from monitors import Activity, ErrorWatch, RssSampler, StallMonitor
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QDialog
from report import SCREEN_SIZES, plot, rss_summary, worst_stall, write_json
from scenarios import Scenarios, Sizes
from user import DriveTimeout, User

from kvscope.app.desktop.launch import set_app_icon
from kvscope.app.desktop.settings.dialog import SettingsDialog
from kvscope.app.desktop.window import MainWindow

STATUS_POLL_MS = 250
STARTUP_TIMEOUT_S = 900  # a cold first launch converts the tokenizer and compiles the kernels


class Drive:
    def __init__(self, args, out: Path, model: str | None, platform: str) -> None:
        self.args, self.out, self.model, self.platform = args, out, model, platform
        self.activity = Activity()
        self.user = User(self.activity)
        self.stalls = StallMonitor(self.activity)
        self.rss = RssSampler(self.activity, interval_s=args.rss_every)
        self.errors = ErrorWatch(self.activity)
        self.runs: list[dict] = []
        self.startup: dict = {}
        self.shots: list[str] = []
        self.exit: dict = {}
        self.status_log: list[tuple] = []
        self._status_seen: tuple = ()
        self.code = 2

    def run(self, app: QApplication) -> None:
        """The whole drive, called from the app's event loop; quits it at the end."""
        try:
            self._drive(app)
            self.code = 1 if self.errors.errors else 0
        except Exception:
            self.errors.add("drive crashed", traceback.format_exc())
            self.code = 2
        finally:
            app.quit()

    def _drive(self, app: QApplication) -> None:
        self.stalls.start()
        self.rss.start()
        self.activity.set("first launch: building the window")
        t0 = time.monotonic()
        window = MainWindow(connections=[])  # as app/desktop/launch.py's run_window does
        self.window = window
        self.errors.install(window)
        self._status_timer = QTimer(interval=STATUS_POLL_MS)
        self._status_timer.timeout.connect(self._log_status)
        self._status_timer.start()
        window.show()
        shown = time.monotonic()
        self.activity.set("first launch: waiting for the engine")
        self.user.wait_until(lambda: window.engine_info, STARTUP_TIMEOUT_S, "the first engine")
        ready = time.monotonic()
        sizes = Sizes(max_tokens=self.args.max_tokens, load_seconds=self.args.load_seconds)
        self.scenarios = Scenarios(
            window, self.user, self.errors, self.rss, self.out, self.model, sizes
        )
        self.startup = {
            "window_built_s": round(shown - t0, 2),
            "engine_ready_after_show_s": round(ready - shown, 1),
            "rss_at_ready_mib": self.rss.sample("engine ready")["rss_mib"],
        }
        end = time.monotonic() + self.args.minutes * 60
        loop = 0
        while loop == 0 or time.monotonic() < end:
            for name, scenario in self.scenarios.all(self.args.only):
                if loop and time.monotonic() >= end:
                    break
                self._one(loop, name, scenario)
                if loop == 0 and name == "chat" and "first_reply_after_show_s" not in self.startup:
                    self.startup["first_reply_after_show_s"] = round(time.monotonic() - shown, 1)
            loop += 1
        self.loops = loop
        self._screenshots()
        # Chat ▸ Quit: its key (QKeySequence.Quit) is Ctrl+Q on X11 and none offscreen.
        self.activity.set("quit: Chat ▸ Quit")
        t_quit = time.monotonic()
        self.user.menu(window, "&Chat", "Quit")
        self.user.wait_until(lambda: not window.isVisible(), 60, "the window to close")
        self.exit["close_s"] = round(time.monotonic() - t_quit, 2)
        self.rss.model = "closed"  # the samples from here on are of the process after the window
        self.exit["rss_after_close_mib"] = self.rss.sample("window closed")["rss_mib"]
        self._status_timer.stop()
        self.exit["settings_dialogs_alive"] = len(window.findChildren(SettingsDialog))

    def _log_status(self) -> None:
        """The status bar's state line and message as they change: what the user was told."""
        status = self.window.status
        line = (status.state_label.text(), status.currentMessage())
        if line != self._status_seen and len(self.status_log) < 5000:
            self._status_seen = line
            self.status_log.append((round(self.activity.now(), 2), *line))

    def _one(self, loop: int, name: str, scenario) -> None:
        self.activity.set(name)
        t0 = time.monotonic()
        row = {"loop": loop, "scenario": name, "t_s": round(self.activity.now(), 1)}
        try:
            row["result"] = scenario()
        except DriveTimeout as e:
            row["error"] = str(e)
            self.errors.add("scenario", f"{name}: {e}")
            self._recover()
        row["wall_s"] = round(time.monotonic() - t0, 1)
        row["stray_dialogs"] = self.errors.close_stray_dialogs()
        # Widgets alive after each scenario: one a window lets go and something still holds
        # grows this count loop after loop, with RSS and the time of every theme change.
        row["widgets_alive"] = len(QApplication.allWidgets())
        self.runs.append(row)
        print(f"[drive] {self.activity.now():7.1f} s  loop {loop} {name}: {row['wall_s']} s"
              + (f"  ERROR {row['error']}" if "error" in row else ""), flush=True)  # fmt: skip

    def _recover(self) -> None:
        """After a failed scenario: stop what runs, close dialogs, so the next one can start."""
        self.activity.set("recovering")
        window = self.window
        for dialog in QApplication.topLevelWidgets():
            if isinstance(dialog, QDialog) and dialog.isVisible():
                dialog.reject()
        if window.loadgen_panel.stop.isEnabled():
            self.user.click(window.loadgen_panel.stop, "Stop load")
        if window.chats.pending and window.chat.stop.isVisible():
            self.user.click(window.chat.stop, "Stop")
        try:
            self.user.wait_until(lambda: not window.chats.pending, 60, "replies to stop")
        except DriveTimeout as e:
            self.errors.add("recover", str(e))

    def _screenshots(self) -> None:
        window = self.window
        for theme in ("dark", "light"):
            if window.settings.theme != theme:
                self.scenarios.switch_theme(theme)
            for width, height in SCREEN_SIZES:
                self.activity.set(f"screenshot {theme} {width}x{height}")
                window.resize(width, height)
                self.user.wait(0.8)
                path = self.out / f"shot-{theme}-{width}x{height}.png"
                grab = window.grab()
                grab.save(str(path))
                self.shots.append(f"{path.name} ({grab.width()}x{grab.height()})")
                if (window.width(), window.height()) != (width, height):
                    hint = window.minimumSizeHint()
                    self.errors.add(
                        "window size",
                        f"asked for {width}x{height}, the window is {window.width()}x"
                        f"{window.height()} (its minimum size hint {hint.width()}x{hint.height()};"
                        f" least widths: {self._least_widths()})",
                    )
        window.resize(*SCREEN_SIZES[-1])

    def _least_widths(self) -> dict[str, int]:
        """Who holds the window wide: each column's and the status bar's least width."""
        window = self.window
        parts = [window.splitter.widget(i) for i in range(window.splitter.count())]
        parts.append(window.statusBar())
        return {
            p.objectName() or type(p).__name__: max(p.minimumSizeHint().width(), p.minimumWidth())
            for p in parts
        }

    def children(self) -> list[dict]:
        """Processes this one started that are still there, ended (they are ours)."""
        me = psutil.Process()
        left = [p for p in me.children(recursive=True) if p.name() != "Xvfb"]
        rows = []
        for p in left:
            try:
                rows.append({"pid": p.pid, "name": p.name(), "cmdline": p.cmdline()[:6]})
                p.terminate()
            except psutil.NoSuchProcess:
                continue
        _gone, alive = psutil.wait_procs(left, timeout=5)
        for p in alive:
            p.kill()
        return rows

    def result(self) -> dict:
        samples, stalls = self.rss.samples, self.stalls.stalls
        events = getattr(self, "scenarios", None).events if hasattr(self, "scenarios") else []
        worst = worst_stall(stalls)
        return {
            "summary": {
                "minutes_asked": self.args.minutes,
                "minutes_run": round(self.activity.now() / 60, 2),
                "loops": getattr(self, "loops", 0),
                "scenarios_run": len(self.runs),
                "scenarios_failed": sum("error" in r for r in self.runs),
                "errors": len(self.errors.errors),
                "rss": rss_summary(samples, events),
                "gui": self.stalls.summary(),
                "widgets_alive": _widgets_by_loop(self.runs),
                "worst_stall": worst,
                "startup": self.startup,
                "exit": self.exit,
                "platform": self.platform,
                "other_model": self.model,
            },
            "scenarios": self.runs,
            "errors": self.errors.errors,
            "stalls": stalls,
            "rss_samples": samples,
            "model_switches": events,
            "qt_warnings": self.errors.qt_warnings,
            "screenshots": self.shots,
            "status_log": self.status_log,
            "activity_log": [(round(t, 2), label) for t, label in self.activity.log],
        }


def _widgets_by_loop(runs: list[dict]) -> dict:
    """Widgets alive after the first loop's last scenario, and after its last run (the time
    may be up mid-loop, so the same scenario, not the last loop's end)."""
    first = [row for row in runs if row["loop"] == 0]
    if not first:
        return {}
    name = first[-1]["scenario"]
    counts = [row["widgets_alive"] for row in runs if row["scenario"] == name]
    return {"after": name, "first_loop": counts[0], "last_loop": counts[-1]}


def run_drive(args, out: Path, model: str | None, platform: str) -> int:
    app = QApplication.instance() or QApplication([])
    app.setApplicationName("KVScope")
    set_app_icon(app)
    drive = Drive(args, out, model, platform)
    QTimer.singleShot(0, lambda: drive.run(app))
    app.exec()
    drive.stalls.stop()
    drive.rss.stop()
    drive.errors.uninstall()
    drive.exit["children_left"] = drive.children()
    result = drive.result()
    write_json(out / "drive.json", result)
    plot(out / "rss.png", drive.rss.samples, drive.stalls.stalls, result["model_switches"])
    s = result["summary"]
    worst = s["worst_stall"]
    print(
        f"[drive] {s['minutes_run']} min, {s['scenarios_run']} scenarios "
        f"({s['scenarios_failed']} failed), {s['errors']} errors; RSS {s['rss'].get('first_mib')}"
        f" -> {s['rss'].get('last_mib')} MiB (max {s['rss'].get('max_mib')}); widgets alive "
        f"{s['widgets_alive']}; worst stall "
        + (f"{worst['late_ms']} ms while {worst['doing']}" if worst else "none")
        + f"; results in {out}",
        flush=True,
    )
    return drive.code
