"""HeldPlots: rolling plots per replica, in its colour: blocks held (from its KV events) and
KV cache usage % (from its /metrics), over the last two minutes, in the block map's style."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QWidget

from kvscope.app.desktop.blockmap import colors
from kvscope.app.desktop.blockmap.plot_title import style_rolling_plot
from kvscope.app.desktop.blockmap.time_plots import HEADROOM, WINDOW_S, restyle_plot
from kvscope.app.desktop.palette import Palette, current
from kvscope.app.desktop.theme import follow_theme

PLOTS = (
    ("held", "Blocks held per replica (KV events) · seconds ago", 8.0),
    ("usage", "KV cache usage per replica (/metrics, %)", (0, 100)),
    ("queue", "Requests running + waiting per replica (/metrics)", 4.0),
    ("rate", "Generated tokens/s per replica (/metrics)", 10.0),
)


def _title(title: str, palette: Palette) -> str:
    return f"<span style='color:{palette.text}; font-size:8pt'>{title}</span>"


class HeldPlots(pg.GraphicsLayoutWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, show=False)
        self.plots: dict[str, pg.PlotItem] = {}
        self.curves: dict[tuple[str, str], pg.PlotDataItem] = {}  # (plot, replica)
        for key, title, y_range in PLOTS:
            plot = self.addPlot(title=_title(title, current()))
            style_rolling_plot(plot, WINDOW_S, y_range)
            plot.getAxis("left").setWidth(40)
            self.plots[key] = plot
            self.nextRow()
        follow_theme(self, self._restyle)

    def _restyle(self, palette: Palette) -> None:
        self.setBackground(colors.active().background_hex)
        for key, title, _y_range in PLOTS:
            self.plots[key].titleLabel.setText(_title(title, palette))
            restyle_plot(self.plots[key], palette)

    def set_series(self, key: str, replica: str, color: str, t: np.ndarray, v: np.ndarray) -> None:
        """One replica's samples (t in seconds before now, v) for plot `key`."""
        curve = self.curves.get((key, replica))
        if curve is None:
            curve = self.plots[key].plot(pen=pg.mkPen(color, width=1.6), connect="finite")
            curve.setClipToView(True)
            self.curves[(key, replica)] = curve
        inside = t >= -WINDOW_S
        # Keep the last sample before the window, so a flat line reaches the left edge.
        first = max(0, int(np.argmax(inside)) - 1) if inside.any() else max(0, len(t) - 1)
        curve.setData(t[first:], v[first:])

    def drop(self, replica: str) -> None:
        for key in list(self.curves):
            if key[1] == replica:
                self.plots[key[0]].removeItem(self.curves.pop(key))

    def rescale(self) -> None:
        for key, _title, y_range in PLOTS:
            if isinstance(y_range, tuple):
                continue
            tops = [
                float(np.nanmax(c.yData))
                for (k, _r), c in self.curves.items()
                if k == key and c.yData is not None and len(c.yData)
            ]
            top = max(tops, default=0.0)
            self.plots[key].setYRange(0, max(top * HEADROOM, y_range), padding=0)


def step_series(history: list[tuple[float, int]], now: float) -> tuple[np.ndarray, np.ndarray]:
    """A cache's (time, blocks held) history as a step line ending at `now`: the count holds
    until the next event, so it is drawn flat to the present."""
    if not history:
        return np.zeros(0), np.zeros(0)
    t = np.array([h[0] for h in history] + [now], dtype=float) - now
    v = np.array([h[1] for h in history] + [history[-1][1]], dtype=float)
    # Each value drawn flat until the next sample: duplicate points at the step's time.
    ts = np.repeat(t, 2)[1:]
    vs = np.repeat(v, 2)[:-1]
    return ts, vs


def scrape_series(history: list, now: float, value) -> tuple[np.ndarray, np.ndarray]:
    """(seconds before now, value(metrics)) for each scrape where `value` gives a number."""
    points = [(m.scraped_at - now, v) for _t, m in history if (v := value(m)) is not None]
    return np.array([p[0] for p in points], dtype=float), np.array([p[1] for p in points])


def rate_series(history: list, now: float, total) -> tuple[np.ndarray, np.ndarray]:
    """A counter's rate between consecutive scrapes (`total(metrics)`), at the later one; a
    counter that went down (a restarted server) gives no point."""
    points, prev = [], None
    for _t, m in history:
        value = total(m)
        if value is not None and prev is not None and m.scraped_at > prev[0] and value >= prev[1]:
            points.append((m.scraped_at - now, (value - prev[1]) / (m.scraped_at - prev[0])))
        prev = (m.scraped_at, value) if value is not None else prev
    return np.array([p[0] for p in points], dtype=float), np.array([p[1] for p in points])
