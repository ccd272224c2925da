"""SweepView: pick a knob, sweep it, and see preemptions, peak concurrency, mean wait and p95
TTFT against it, with the what-if's current setting marked.

The knob's axis is logarithmic (each knob is a size or a rate: doublings matter). Points whose
settings cannot run (a pool too small for one block) are left out of the curves and counted in
the status line with the first reason. The sweep itself runs on the SimRunner's thread; this
view only asks (`sweep_requested`) and draws (`set_points`).
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from kvscope.app.desktop.blockmap import colors
from kvscope.app.desktop.blockmap.plot_title import wrap_title
from kvscope.app.desktop.blockmap.time_plots import restyle_plot
from kvscope.app.desktop.palette import Palette
from kvscope.app.desktop.theme import follow_theme
from kvscope.app.desktop.whatif import knobs
from kvscope.engine.whatif import SweepPoint

MAX_TICKS = 6


def log_ticks(xs) -> list[tuple[float, str]]:
    """At most MAX_TICKS of the swept values as the axis's labels, at their log10 place (the
    axis is in log10 in log mode); pyqtgraph's own crowded the minor decades' labels."""
    values = sorted(set(float(x) for x in xs if x > 0))
    if len(values) > MAX_TICKS:
        picks = np.linspace(0, len(values) - 1, MAX_TICKS).round().astype(int)
        values = [values[i] for i in sorted(set(picks))]
    return [(math.log10(v), f"{v:.3g}") for v in values]


class SweepView(QWidget):
    sweep_requested = Signal(str)  # the knob to sweep (a key of knobs.SWEEPS)

    def __init__(self, parent: QWidget | None = None, columns: int = 2) -> None:
        super().__init__(parent)
        self.knob = QComboBox()
        self.knob.setObjectName("whatifSweepKnob")
        for key, (label, _axis) in knobs.SWEEPS.items():
            self.knob.addItem(label, key)
        self.run = QPushButton("Run sweep")
        self.run.setObjectName("whatifSweep")
        self.run.setToolTip("Simulate this trace at ~8-20 values of the knob, the rest as set")
        self.status = QLabel("", wordWrap=True)
        self.status.setObjectName("whatifSweepStatus")
        self.graphs = pg.GraphicsLayoutWidget(show=False)
        self.plots: list[pg.PlotItem] = []
        self.curves: list[pg.PlotDataItem] = []
        self.markers: list[pg.InfiniteLine] = []
        self.points: list[SweepPoint] = []
        self.swept = ""  # the knob of the points shown
        self.marked: float | None = None  # the current setting, on the knob's axis
        tick_font = QFont()
        tick_font.setPointSize(7)
        for i, (_field, title) in enumerate(knobs.SWEEP_FIGURES):
            if i and i % columns == 0:
                self.graphs.nextRow()
            plot = self.graphs.addPlot(title=title)
            wrap_title(plot)
            plot.setMenuEnabled(False)
            plot.setMouseEnabled(x=False, y=False)
            plot.hideButtons()
            plot.showGrid(x=True, y=True, alpha=0.15)
            plot.setLogMode(x=True, y=False)
            plot.getAxis("left").setWidth(36)
            for axis in ("left", "bottom"):
                plot.getAxis(axis).setStyle(tickFont=tick_font, tickTextOffset=3)
            self.curves.append(plot.plot(symbol="o", symbolSize=5))
            marker = pg.InfiniteLine(angle=90, movable=False)
            marker.setVisible(False)
            plot.addItem(marker, ignoreBounds=True)
            self.markers.append(marker)
            self.plots.append(plot)
        row = QHBoxLayout()
        row.addWidget(QLabel("Vary"))
        row.addWidget(self.knob)
        row.addWidget(self.run)
        row.addWidget(self.status, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.graphs, 1)
        self.run.clicked.connect(lambda: self.sweep_requested.emit(self.knob.currentData()))
        follow_theme(self, self._restyle)

    def _restyle(self, palette: Palette) -> None:
        theme = colors.active()
        self.graphs.setBackground(theme.background_hex)
        for plot, (_field, title) in zip(self.plots, knobs.SWEEP_FIGURES, strict=True):
            plot.titleLabel.setText(
                f"<span style='color:{palette.text}; font-size:8pt'>{title}</span>"
            )
            restyle_plot(plot, palette)
        for curve in self.curves:
            curve.setPen(pg.mkPen(theme.naive_hex, width=1.6))
            curve.setSymbolBrush(theme.naive_hex)
            curve.setSymbolPen(theme.naive_hex)
        for marker in self.markers:
            marker.setPen(pg.mkPen(theme.paged_hex, width=1.2, style=Qt.PenStyle.DashLine))

    def clear(self) -> None:
        """No sweep shown (a new trace: the old points are of other traffic)."""
        self.points, self.swept = [], ""
        for curve in self.curves:
            curve.setData([], [])
        self.mark(None)
        self.run.setEnabled(True)
        self.status.setText("")

    def set_busy(self, knob: str, count: int) -> None:
        self.run.setEnabled(False)
        self.status.setText(f"Sweeping {knobs.SWEEPS[knob][0].lower()} over {count} values…")

    def set_error(self, message: str) -> None:
        self.run.setEnabled(True)
        self.status.setText(f"The sweep failed: {message}")

    def set_points(self, knob: str, points: list[SweepPoint], current_x: float | None) -> None:
        """Draw a finished sweep; `current_x` is the what-if's own value of the knob."""
        self.run.setEnabled(True)
        self.points, self.swept = list(points), knob
        ran = [p for p in points if p.summary is not None]
        failed = [p for p in points if p.summary is None]
        xs = np.array([knobs.sweep_x(knob, p) for p in ran], dtype=float)
        for curve, (field, _title) in zip(self.curves, knobs.SWEEP_FIGURES, strict=True):
            ys = np.array([getattr(p.summary, field) for p in ran], dtype=float)
            curve.setData(xs, ys)
        self.mark(current_x)
        ticks = log_ticks(xs)
        for plot, curve in zip(self.plots, self.curves, strict=True):
            plot.getAxis("bottom").setTicks([ticks, []])
            plot.enableAutoRange(axis="x")
            ys = curve.getData()[1]
            top = float(np.nanmax(ys)) if ys is not None and len(ys) else 0.0
            plot.setYRange(0, top * 1.15 if top > 0 else 1.0, padding=0)
        line = f"x: {knobs.SWEEPS[knob][1]} · {len(ran)} of {len(points)} values ran"
        if failed:
            line += f"; {len(failed)} cannot: {failed[0].error}"
        self.status.setText(line)

    def mark(self, x: float | None) -> None:
        """Mark the current setting (None: none, e.g. before any sweep)."""
        self.marked = x if self.swept else None
        for marker in self.markers:
            marker.setVisible(self.marked is not None and self.marked > 0)
            if self.marked is not None and self.marked > 0:
                marker.setValue(math.log10(self.marked))  # the axis is log10 in log mode
