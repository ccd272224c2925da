"""TimePlots: rolling two-minute pyqtgraph plots of the pool, paged next to naive."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget

from kvscope.app.desktop.blockmap import colors
from kvscope.app.desktop.blockmap.plot_title import style_rolling_plot
from kvscope.app.desktop.palette import Palette, current
from kvscope.app.desktop.theme import follow_theme

WINDOW_S = 120.0
REDRAW_S = 0.5  # samples come ~10 times a second; a two-minute plot needs far fewer redraws
CAPACITY = 4096  # samples kept (about 6 minutes at 10 Hz); trimmed by time when drawing
DASH = Qt.PenStyle.DashLine
PAGED, NAIVE, GREEN, RED, GREY = "paged", "naive", "good", "bad", "neutral"  # colour roles

# (series key, legend name, colour role (colors.MapColors: its <role>_hex in the theme on show),
# pen style (None: solid))
Series = tuple[str, str, str, Qt.PenStyle | None]
# (title, y unit, fixed y range or the least top of a range from 0, its series). Free ranges
# start at 0 too: autoscaling to the data's own span made a 0.0001 GiB wobble in memory look
# like a jump.
PLOTS: tuple[tuple[str, str, tuple[float, float] | float, list[Series]], ...] = (
    (
        "KV held",
        "%",
        (0, 100),
        [
            ("paged_held", "paged", PAGED, None),
            ("naive_held", "naive", NAIVE, None),
        ],
    ),
    (
        "Useful-slot share",
        "%",
        (0, 100),
        [
            ("paged_useful", "paged", PAGED, None),
            ("naive_useful", "naive", NAIVE, None),
        ],
    ),
    (
        "Sequences",
        "",
        4.0,
        [
            ("running", "run", GREEN, None),
            ("waiting", "wait", PAGED, None),
            ("preempted", "preempt", RED, None),
            ("naive_waiting", "naive wait", NAIVE, DASH),
        ],
    ),
    ("Tokens / s", "", 10.0, [("tokens_per_s", "generated", PAGED, None)]),
    ("Prefix hit rate (10 s)", "%", (0, 100), [("prefix_hit", "hits", GREEN, None)]),
    (
        "Memory",
        "GiB",
        0.5,
        [("mem_used", "used", GREY, None), ("mem_process", "this process", PAGED, None)],
    ),
)
SERIES = tuple(key for _t, _u, _r, series in PLOTS for key, *_ in series)
HEADROOM = 1.15  # a free range's top above its largest value
ROW_MIN_PX = 80  # a plot row keeps its title, axis and a readable curve


def role_hex(role: str) -> str:
    """A series colour role in the theme on show."""
    return getattr(colors.active(), f"{role}_hex")


def _title(title: str, unit: str, series: list[Series], palette: Palette) -> str:
    # Sizes inside the spans: LabelItem's own size attribute does not reach styled spans.
    names = " ".join(
        f"<span style='color:{role_hex(role)}; font-size:7pt'>■ {name}</span>"
        for _k, name, role, _s in series
    )
    unit = f" ({unit})" if unit else ""
    return f"<span style='color:{palette.text}; font-size:8pt'>{title}{unit}</span>&nbsp;{names}"


def restyle_plot(plot: pg.PlotItem, palette: Palette) -> None:
    """Axis lines and tick labels in a theme's colours."""
    for axis in ("left", "bottom"):
        plot.getAxis(axis).setTextPen(palette.axis_text)
        plot.getAxis(axis).setPen(palette.axis)


class TimePlots(pg.GraphicsLayoutWidget):
    def __init__(self, parent: QWidget | None = None, columns: int = 3) -> None:
        super().__init__(parent, show=False)
        self._t = np.zeros(CAPACITY)
        self._v = np.full((CAPACITY, len(SERIES)), np.nan)
        self._n = 0
        self._drawn_at = -math.inf
        self.curves: dict[str, pg.PlotDataItem] = {}
        for i, (title, unit, y_range, series) in enumerate(PLOTS):
            if i and i % columns == 0:
                self.nextRow()
            plot = self.addPlot(title=_title(title, unit, series, current()))
            plot.titleLabel.setAttr("size", "8pt")
            # A long title wraps rather than widening the plots or overlapping its neighbour.
            style_rolling_plot(plot, WINDOW_S, y_range)
            if isinstance(y_range, tuple):
                ticks = [(v, f"{v:g}") for v in np.linspace(*y_range, 3)]
                plot.getAxis("left").setTicks([ticks, []])
                plot.getAxis("left").setStyle(hideOverlappingLabels=False)
            plot.getAxis("left").setWidth(36)
            for key, _name, _role, _style in series:
                self.curves[key] = plot.plot(connect="finite")
                self.curves[key].setClipToView(True)
        self.plots = [self.getItem(i // columns, i % columns) for i in range(len(PLOTS))]
        self.columns = columns
        self.rows = -(-len(PLOTS) // columns)
        self.rows_shown = self.rows
        follow_theme(self, self._restyle)

    def chrome_px(self) -> int:
        """The grid's margins and row spacing: what ROW_MIN_PX per row leaves out."""
        grid = self.ci.layout
        _left, top, _right, bottom = grid.getContentsMargins()
        return int(top + bottom + grid.verticalSpacing() * (self.rows - 1))

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        if not hasattr(self, "rows_shown"):  # pyqtgraph's own constructor resizes first
            return
        # In a short window the first row (held, useful slots, sequences) stays readable and
        # the rest step aside; their figures are in the metrics strip above the maps.
        fits = int((self.height() - self.chrome_px()) // ROW_MIN_PX)
        self._show_rows(min(self.rows, max(1, fits)))

    def _show_rows(self, rows: int) -> None:
        if rows == self.rows_shown:
            return
        for i, plot in enumerate(self.plots):
            row, col = divmod(i, self.columns)
            shown = plot in self.ci.items
            if row < rows and not shown:
                self.ci.addItem(plot, row=row, col=col)
            elif row >= rows and shown:
                self.ci.removeItem(plot)
                plot.hide()
            if row < rows:
                plot.show()
        self.rows_shown = rows

    def _restyle(self, palette: Palette) -> None:
        """The ground, titles, axes and series pens in a theme's colours."""
        self.setBackground(colors.active().background_hex)
        for plot, (title, unit, _y_range, series) in zip(self.plots, PLOTS, strict=True):
            plot.titleLabel.setText(_title(title, unit, series, palette))  # keeps its wrapping
            restyle_plot(plot, palette)
            for key, _name, role, style in series:
                pen = pg.mkPen(role_hex(role), width=1.6, style=style or Qt.PenStyle.SolidLine)
                self.curves[key].setPen(pen)

    def add_sample(self, t: float, values: Mapping[str, float | None]) -> None:
        """Append one sample (missing or None values are gaps) and redraw."""
        if self._n == CAPACITY:
            keep = CAPACITY // 2
            self._t[:keep] = self._t[-keep:]
            self._v[:keep] = self._v[-keep:]
            self._n = keep
        self._t[self._n] = t
        row = [values.get(k) for k in SERIES]
        self._v[self._n] = [math.nan if v is None else float(v) for v in row]
        self._n += 1
        if t - self._drawn_at >= REDRAW_S or t < self._drawn_at:
            self.redraw()

    def redraw(self) -> None:
        for key, curve in self.curves.items():
            curve.setData(*self.series(key))
        for plot, (_title, _unit, y_range, series) in zip(self.plots, PLOTS, strict=True):
            if not isinstance(y_range, tuple):
                values = np.concatenate([self.series(key)[1] for key, *_ in series])
                top = np.nanmax(values) if np.isfinite(values).any() else 0.0
                plot.setYRange(0, max(float(top) * HEADROOM, y_range), padding=0)
        self._drawn_at = self._t[self._n - 1] if self._n else -math.inf

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(seconds before the newest sample, values) of one series inside the window."""
        t, v = self._t[: self._n], self._v[: self._n, SERIES.index(key)]
        if not self._n:
            return t, v
        start = np.searchsorted(t, t[-1] - WINDOW_S)
        return t[start:] - t[-1], v[start:]
