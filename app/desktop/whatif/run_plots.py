"""RunPlots: both runs over one time axis (blocks used, running, waiting, preemptions so far),
recorded and what-if as two curves a plot, with a cursor at the time the maps show.

A run's value after a step holds from that step's end to the next one's, so the curves are
drawn as steps; the what-if's times past its divergence are modelled.
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QWidget

from kvscope.app.desktop.blockmap import colors
from kvscope.app.desktop.blockmap.plot_title import wrap_title
from kvscope.app.desktop.blockmap.time_plots import restyle_plot
from kvscope.app.desktop.palette import Palette, current
from kvscope.app.desktop.theme import follow_theme
from kvscope.engine.whatif import SimResult

PLOTS = (
    ("blocks_used", "Blocks used"),
    ("running", "Running"),
    ("waiting", "Waiting"),
    ("preemptions", "Preemptions (so far)"),
)
SIDES = ("recorded", "whatif")


def step_curve(result: SimResult, key: str, until: float) -> tuple[np.ndarray, np.ndarray]:
    """x (len n + 1: each step's end, then `until`) and y (len n) for stepMode="center"."""
    ends = np.array([s.time + s.duration for s in result.steps])
    values = np.array([getattr(s, key) for s in result.steps], dtype=float)
    if not len(ends):
        return np.zeros(1), np.zeros(0)
    return np.append(ends, max(until, ends[-1] + 1e-9)), values


def count_ticks(top: float) -> list[tuple[float, str]]:
    """Whole-number ticks from 0 to top, four or five of them: every series here counts."""
    step = max(1, math.ceil(top / 4))
    return [(float(v), f"{v:,}") for v in range(0, int(top) + 1, step)]


def title_html(title: str, palette: Palette) -> str:
    theme = colors.active()
    names = " ".join(
        f"<span style='color:{color}; font-size:7pt'>■ {name}</span>"
        for name, color in (("recorded", theme.paged_hex), ("what if", theme.naive_hex))
    )
    return f"<span style='color:{palette.text}; font-size:8pt'>{title}</span>&nbsp;{names}"


class RunPlots(pg.GraphicsLayoutWidget):
    def __init__(self, parent: QWidget | None = None, columns: int = 2) -> None:
        super().__init__(parent, show=False)
        self.plots: list[pg.PlotItem] = []
        self.curves: dict[tuple[str, str], pg.PlotDataItem] = {}
        self.cursors: list[pg.InfiniteLine] = []
        tick_font = QFont()
        tick_font.setPointSize(7)
        for i, (key, title) in enumerate(PLOTS):
            if i and i % columns == 0:
                self.nextRow()
            plot = self.addPlot(title=title_html(title, current()))
            wrap_title(plot)
            plot.setMenuEnabled(False)
            plot.setMouseEnabled(x=False, y=False)
            plot.hideButtons()
            plot.showGrid(x=True, y=True, alpha=0.15)
            plot.getAxis("left").setWidth(36)
            for axis in ("left", "bottom"):
                plot.getAxis(axis).setStyle(tickFont=tick_font, tickTextOffset=3)
            for side in SIDES:
                self.curves[(side, key)] = plot.plot(stepMode="center")
            cursor = pg.InfiniteLine(angle=90, movable=False)
            plot.addItem(cursor, ignoreBounds=True)
            self.cursors.append(cursor)
            self.plots.append(plot)
        follow_theme(self, self._restyle)

    def _restyle(self, palette: Palette) -> None:
        theme = colors.active()
        self.setBackground(theme.background_hex)
        pens = {
            "recorded": pg.mkPen(theme.paged_hex, width=1.6),
            "whatif": pg.mkPen(theme.naive_hex, width=1.6, style=Qt.PenStyle.DashLine),
        }
        for plot, (key, title) in zip(self.plots, PLOTS, strict=True):
            plot.titleLabel.setText(title_html(title, palette))
            restyle_plot(plot, palette)
            for side in SIDES:
                self.curves[(side, key)].setPen(pens[side])
        for cursor in self.cursors:
            cursor.setPen(pg.mkPen(palette.strong, width=1, style=Qt.PenStyle.DotLine))

    def set_runs(self, recorded: SimResult | None, whatif: SimResult | None, until: float) -> None:
        """Draw both runs from 0 to `until` (the longer one's end); a side of None is empty."""
        for plot, (key, _title) in zip(self.plots, PLOTS, strict=True):
            top = 1.0
            for side, result in (("recorded", recorded), ("whatif", whatif)):
                curve = self.curves[(side, key)]
                if result is None or not result.steps:
                    curve.setData([], [])
                    continue
                x, y = step_curve(result, key, until)
                curve.setData(x, y, stepMode="center")
                top = max(top, float(y.max()))
            plot.setXRange(0, max(until, 1e-3), padding=0.01)
            plot.setYRange(0, top * 1.1, padding=0)  # from 0: a small rise stays small
            plot.getAxis("left").setTicks([count_ticks(top), []])

    def set_cursor(self, t: float) -> None:
        for cursor in self.cursors:
            cursor.setValue(t)
