"""WhatIfPanel: this engine's own traffic replayed under other settings, beside the recording.

Given a trace (the engine's TraceLog, taken on the worker's thread), the panel replays it once
as recorded (`simulate(trace, keep_events=True)`: the recorded side's pool at every step) and
again whenever a knob moves (debounced, on the SimRunner's thread, never the GUI's). Both runs
are shown at one time t: two block maps with their figures, plots of both over time with a
cursor, the figures side by side, the cost model's fit, and where the what-if leaves the
recording. A sweep varies one knob. "Apply these settings" hands the what-if's engine knobs to
the window's apply path (app/desktop/whatif/apply.py says which, and why some cannot).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import cast

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSplitter,
    QStackedWidget,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.core.settings import AppSettings
from kvscope.app.desktop.blockmap.panel import banner_style, panel_style
from kvscope.app.desktop.palette import Palette
from kvscope.app.desktop.theme import follow_theme
from kvscope.app.desktop.whatif import knobs, summary
from kvscope.app.desktop.whatif.apply import ApplyPlan, plan_apply
from kvscope.app.desktop.whatif.controls import WhatIfControls
from kvscope.app.desktop.whatif.jobs import (
    RecordedRun,
    SweepJob,
    SweepRun,
    WhatIfRun,
    replay_recorded,
    simulate_whatif,
)
from kvscope.app.desktop.whatif.run_plots import RunPlots
from kvscope.app.desktop.whatif.runner import Outcome, SimRunner
from kvscope.app.desktop.whatif.side import RunSide
from kvscope.app.desktop.whatif.sweep_plot import SweepView
from kvscope.app.desktop.whatif.timeline import Timeline
from kvscope.engine.trace import Trace
from kvscope.engine.whatif import (
    PoolSeeker,
    SimResult,
    SimSummary,
    WhatIf,
    cost_caveat,
    recorded_config,
    resolve,
)

DEBOUNCE_MS = 150
EMPTY_TEXT = (
    "Chat or start simulated users, then come back: the what-if replays this engine's own traffic."
)
# Shown while a simulation waits (SimRunner.paused): beside the engine it would slow every step.
WAITING_TEXT = "Waiting for the engine: the what-if goes on once no reply is being generated."


class WhatIfPanel(QWidget):
    apply_requested = Signal(object)  # AppSettings for the window's apply path
    refresh_requested = Signal()  # take a new trace of the engine

    def __init__(
        self,
        app_settings: Callable[[], AppSettings] = AppSettings,
        parent: QWidget | None = None,
        engine_idle: threading.Event | None = None,  # the worker's: simulations wait for it
    ) -> None:
        super().__init__(parent)
        self.setObjectName("whatIfPanel")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self._app_settings = app_settings  # the window's settings now (Apply starts from them)
        self.trace: Trace | None = None
        self.recorded: SimResult | None = None
        self.recorded_figures: SimSummary | None = None  # the recorded run's, from its trace
        self.result: SimResult | None = None  # the what-if's run
        self.what = WhatIf()  # the knobs `result` ran under
        self._sweep: SweepJob | None = None  # the sweep in progress or last run
        self._as_recorded: PoolSeeker | None = None  # the what-if map's, at the recorded knobs
        self.error = ""  # resolve()'s or the simulation's error for the knobs as set
        self.runner = SimRunner(self, engine_idle=engine_idle)
        self.runner.finished.connect(self._on_outcome)
        self.runner.paused.connect(self._on_paused)
        self._debounce = QTimer(self, singleShot=True, interval=DEBOUNCE_MS)
        self._debounce.timeout.connect(self.resimulate)
        self._build()
        follow_theme(self, self._restyle)

    # ---- layout ---------------------------------------------------------------------------
    def _build(self) -> None:
        self.empty_text = QLabel(EMPTY_TEXT, wordWrap=True)
        self.empty_text.setObjectName("whatifEmpty")
        self.empty_text.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_refresh = QPushButton("Refresh")
        self.empty_refresh.setObjectName("whatifEmptyRefresh")
        empty = QWidget()
        empty_layout = QVBoxLayout(empty)
        empty_layout.addStretch(1)
        empty_layout.addWidget(self.empty_text)
        empty_layout.addWidget(self.empty_refresh, 0, Qt.AlignmentFlag.AlignHCenter)
        empty_layout.addStretch(2)

        self.about = QLabel(wordWrap=True)
        self.about.setObjectName("whatifAbout")
        self.refresh = QPushButton("Refresh")
        self.refresh.setObjectName("whatifRefresh")
        self.refresh.setToolTip("Take the engine's traffic again, with what it did since")
        self.note = QLabel(wordWrap=True)
        self.note.setObjectName("whatifNote")
        self.note.setVisible(False)
        self.waiting = QLabel(WAITING_TEXT, wordWrap=True)
        self.waiting.setObjectName("whatifWaiting")
        self.waiting.setVisible(False)
        self.controls = WhatIfControls()
        self.apply = QPushButton("Apply these settings")
        self.apply.setObjectName("whatifApply")
        self.apply.setEnabled(False)
        self.apply_note = QLabel(wordWrap=True)
        self.apply_note.setObjectName("whatifApplyNote")
        self.apply_note.setVisible(False)
        self.error_label = QLabel(wordWrap=True)
        self.error_label.setObjectName("whatifError")
        self.error_label.setVisible(False)
        self.headline = QLabel(wordWrap=True)
        self.headline.setObjectName("whatifHeadline")
        self.headline.setTextFormat(Qt.TextFormat.RichText)
        self.recorded_side, self.whatif_side = RunSide(recorded=True), RunSide(recorded=False)
        self.timeline = Timeline()
        self.figures = QLabel(wordWrap=True)
        self.figures.setObjectName("whatifFigures")
        self.figures.setTextFormat(Qt.TextFormat.RichText)
        self.figures.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.cost_line = QLabel(wordWrap=True)
        self.cost_line.setObjectName("whatifCost")
        self.plots = RunPlots()
        self.sweep_view = SweepView()

        header = QHBoxLayout()
        header.addWidget(self.about, 1)
        header.addWidget(self.refresh)
        self.controls.add_button(self.apply)
        maps = QHBoxLayout()
        maps.setSpacing(10)
        maps.addWidget(self.recorded_side, 1)
        maps.addWidget(self.whatif_side, 1)
        top = QWidget()
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(0, 0, 0, 0)
        top_layout.addLayout(header)
        top_layout.addWidget(self.waiting)
        top_layout.addWidget(self.note)
        top_layout.addWidget(self.controls)
        top_layout.addWidget(self.apply_note)
        top_layout.addWidget(self.error_label)
        top_layout.addWidget(self.headline)
        top_layout.addLayout(maps, 1)
        top_layout.addWidget(self.timeline)
        figures_page = QWidget()
        figures_page.setObjectName("whatifFiguresPage")
        figures_layout = QHBoxLayout(figures_page)  # the table, and beside it the cost model
        figures_layout.addWidget(self.figures)
        figures_layout.addWidget(self.cost_line, 1, Qt.AlignmentFlag.AlignTop)
        figures = QScrollArea(widgetResizable=True)
        figures.setFrameShape(QFrame.Shape.NoFrame)
        figures.setWidget(figures_page)
        self.tabs = QTabWidget(documentMode=True)
        self.tabs.setObjectName("whatifTabs")
        self.tabs.addTab(self.plots, "Over time")
        self.tabs.addTab(figures, "Figures")
        self.tabs.addTab(self.sweep_view, "Sweep")
        splitter = QSplitter(Qt.Orientation.Vertical, childrenCollapsible=False)
        splitter.addWidget(top)
        splitter.addWidget(self.tabs)
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 2)
        splitter.setSizes([520, 330])  # the plots keep ~150 px a row at 860 px of window
        content = QWidget()
        content_layout = QVBoxLayout(content)
        content_layout.setContentsMargins(0, 0, 0, 0)
        content_layout.addWidget(splitter)

        self.stack = QStackedWidget()
        self.stack.addWidget(empty)
        self.stack.addWidget(content)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.stack)

        for button in (self.refresh, self.empty_refresh):
            button.clicked.connect(self.refresh_requested)
        self.controls.changed.connect(self._debounce.start)
        self.apply.clicked.connect(self._apply_clicked)
        self.timeline.time_changed.connect(self._show_time)
        self.sweep_view.sweep_requested.connect(self.run_sweep)

    def _restyle(self, palette: Palette) -> None:
        sheet = panel_style(palette).replace("#blockMapPanel", "#whatIfPanel")
        self.setStyleSheet(sheet + f" #whatifFiguresPage {{ background: {palette.ground}; }}")
        self.note.setStyleSheet(banner_style(palette))
        self.error_label.setStyleSheet(f"color: {palette.error};")
        for label in (self.apply_note, self.cost_line, self.about, self.waiting):
            label.setStyleSheet(f"color: {palette.muted}; font-size: 11px;")
        self.empty_text.setStyleSheet(f"color: {palette.text}; font-size: 13px;")
        self._show_runs()  # the captions' and the table's colours are the theme's

    # ---- a trace --------------------------------------------------------------------------
    def set_trace(self, trace: Trace | None) -> None:
        """Replay this trace (None, or one with no finished request: the empty state)."""
        for kind in ("recorded", "whatif", "sweep"):
            self.runner.cancel(kind)
        self.timeline.pause()
        self.trace, self.recorded, self.result, self.error = trace, None, None, ""
        self._sweep = None
        self.sweep_view.clear()
        if trace is None or not trace.finished_requests:
            running = len(trace.requests) if trace is not None else 0
            more = f" ({running} request{'s' * (running != 1)} still running)" if running else ""
            self.empty_text.setText(EMPTY_TEXT + more)
            self.stack.setCurrentIndex(0)
            return
        self.stack.setCurrentIndex(1)
        self.controls.set_recording(trace.settings, recorded_config(trace.settings))
        self.about.setText(summary.trace_line(trace))
        note = summary.completeness_note(trace)
        self.note.setText(note)
        self.note.setVisible(bool(note))
        self.headline.setText("Replaying the recording…")
        for side in (self.recorded_side, self.whatif_side):
            side.set_run(None, summary.side_caption(side.recorded, None))
        self.runner.submit("recorded", lambda job: replay_recorded(trace, job.between_steps))

    def _on_paused(self, paused: bool) -> None:
        self.waiting.setVisible(paused)

    def _on_outcome(self, outcome: Outcome) -> None:
        if outcome.generation != self.runner.current(outcome.kind):
            return  # superseded: a newer trace, knob or sweep asked since
        if outcome.kind == "sweep":
            job = self._sweep.rest(outcome.error) if outcome.stuck and self._sweep else None
            if job is not None and len(job.done) < len(job.points):
                self._sweep = job
                self.runner.submit("sweep", job)  # the points after the one that hung
            elif job is not None:
                self.sweep_view.set_points(job.knob, job.done, self._current_x(job.knob))
            elif outcome.error:
                self.sweep_view.set_error(outcome.error)
            else:  # the outcome's kind says which job's result it holds
                knob, points = cast(SweepRun, outcome.result)
                self.sweep_view.set_points(knob, points, self._current_x(knob))
            return
        if outcome.error:
            self._show_error(outcome.error)
            return
        if outcome.kind == "recorded":
            run = cast(RecordedRun, outcome.result)
            self.recorded, self.recorded_figures, seeker, self._as_recorded = run
            # A current outcome is of the trace set last (set_trace cancels the older ones).
            assert self.trace is not None
            notes = [summary.completeness_note(self.trace), summary.self_replay_note(self.recorded)]
            self.note.setText(" ".join(n for n in notes if n))
            self.note.setVisible(any(notes))
            caption = summary.side_caption(True, self.recorded.config)
            self.recorded_side.set_run(self.recorded, caption, seeker)
            peak = max(self.recorded.steps, key=lambda s: s.blocks_used, default=None)
            self.resimulate()
            if peak is not None:  # start where the pool was fullest
                self.timeline.set_time(peak.time + peak.duration)
            return
        what, result, seeker = cast(WhatIfRun, outcome.result)
        self._show_whatif(what, result, seeker)

    # ---- the what-if ----------------------------------------------------------------------
    def resimulate(self) -> None:
        """Simulate the knobs as set now (the debounce timer calls this)."""
        if self.trace is None or self.recorded is None:
            return
        what, trace = self.controls.what(), self.trace
        try:
            config = resolve(trace.settings, what)
        except ValueError as e:  # e.g. a pool that holds no block: say so, keep the last run
            self.runner.cancel("whatif")
            self._show_error(str(e))
            return
        self.controls.pool_note.setText(f"= {config.num_blocks:,} blocks")
        if what == WhatIf():  # as recorded: the recorded run is the answer
            self.runner.cancel("whatif")
            self._show_whatif(what, self.recorded, self._as_recorded)
            return
        cost = self.recorded.cost
        self.runner.submit(
            "whatif", lambda job: simulate_whatif(trace, what, cost, job.between_steps)
        )

    def _show_error(self, message: str) -> None:
        self.error = message
        self.error_label.setText(message)
        self.error_label.setVisible(True)
        self.controls.pool_note.setText("")
        self.result = None
        self.whatif_side.set_run(None, summary.side_caption(False, None, self.controls.what()))
        self.apply.setEnabled(False)
        self.apply.setToolTip(f"Cannot apply: {message}")
        self._show_runs()

    def _show_whatif(self, what: WhatIf, result: SimResult, seeker: PoolSeeker | None) -> None:
        self.what, self.result, self.error = what, result, ""
        self.error_label.setVisible(False)
        self.whatif_side.set_run(result, summary.side_caption(False, result.config, what), seeker)
        self._show_runs()
        self._update_apply()
        if self.sweep_view.swept:
            self.sweep_view.mark(self._current_x(self.sweep_view.swept))

    def _show_runs(self) -> None:
        """Plots, figures, headline and the time axis for the runs as they are now."""
        if self.recorded is None or self.recorded_figures is None:  # set together
            return
        sides = (self.recorded_side, self.whatif_side)
        until = max(side.end_time for side in sides)
        self.plots.set_runs(self.recorded, self.result, until)
        self.recorded_side.set_caption(summary.side_caption(True, self.recorded.config))
        if self.result is not None:
            self.whatif_side.set_caption(summary.side_caption(False, self.result.config, self.what))
        whatif = self.result.summary if self.result is not None else None
        self.figures.setText(summary.figures_html(self.recorded_figures, whatif))
        cost = (self.result or self.recorded).cost
        self.cost_line.setText("Cost model (the what-if's step times): " + cost.describe())
        if self.result is not None:
            caveat = cost_caveat(self.trace.settings, self.result.config) if self.trace else ""
            self.headline.setText(summary.headline(self.recorded_figures, self.result, caveat))
        else:
            self.headline.setText("")
        self.timeline.set_duration(until)  # shows the maps at the time kept

    def _show_time(self, t: float) -> None:
        for side in (self.recorded_side, self.whatif_side):
            side.show_at(t)
        self.plots.set_cursor(t)

    # ---- apply ----------------------------------------------------------------------------
    def _plan(self) -> ApplyPlan | None:
        if self.result is None or self.trace is None:
            return None
        return plan_apply(self.what, self.result.config, self.trace.settings, self._app_settings())

    def _update_apply(self) -> None:
        plan = self._plan()
        self.apply.setEnabled(plan is not None and plan.can_apply)
        self.apply.setToolTip(plan.tooltip() if plan is not None else "")
        lines = []
        if plan is not None and plan.problems:
            lines.append("Cannot apply: " + "; ".join(plan.problems) + ".")
        if plan is not None and plan.left_out:
            lines.append("Not engine settings, left out: " + "; ".join(plan.left_out) + ".")
        self._set_apply_note(" ".join(lines))

    def _apply_clicked(self) -> None:
        plan = self._plan()
        if plan is None or not plan.can_apply:
            return
        self.apply_requested.emit(plan.settings)
        self.apply.setEnabled(False)
        self._set_apply_note(
            "Applied: the engine rebuilds with " + ", ".join(plan.changes) + ". Chat or run "
            "simulated users on it, then Refresh to replay its own traffic."
        )

    def _set_apply_note(self, text: str) -> None:
        self.apply_note.setText(text)
        self.apply_note.setVisible(bool(text))

    # ---- sweeps ---------------------------------------------------------------------------
    def run_sweep(self, knob: str) -> None:
        if self.trace is None or self.recorded is None:
            return
        trace = self.trace
        values = knobs.sweep_values(knob, trace.settings, self.recorded.config)
        points = knobs.sweep_whatifs(knob, values, self.controls.what())
        self.sweep_view.set_busy(knob, len(points))
        self._sweep = SweepJob(knob, trace, points, self.recorded.cost)
        self.runner.submit("sweep", self._sweep)

    def _current_x(self, knob: str) -> float | None:
        return knobs.knob_value(knob, self.result.config) if self.result is not None else None

    def shutdown(self) -> None:
        """Stop playing and wait for the runner's jobs (the tab is closing)."""
        self.timeline.pause()
        self._debounce.stop()
        self.runner.shutdown()
