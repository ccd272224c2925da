"""RunSide: one run (recorded, or the what-if) at a moment: its caption, its pool on a block
map and a row of figures.

Both sides are shown at the same time t, not the same step: the what-if may run longer or
shorter than the recording. A side shows the pool after its last step that had ended by t
(bisecting its steps' end times), rebuilt by a PoolSeeker from the simulation's KV events.
"""

from __future__ import annotations

import bisect

from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from kvscope.app.desktop.blockmap import colors
from kvscope.app.desktop.blockmap.block_map import BlockMapView
from kvscope.app.desktop.blockmap.caption_label import CaptionLabel
from kvscope.app.desktop.blockmap.metrics_strip import tile_style
from kvscope.app.desktop.palette import Palette
from kvscope.app.desktop.theme import follow_theme
from kvscope.engine.trace import TracedStep
from kvscope.engine.whatif import PoolSeeker, SimResult

FIGURES = (
    ("step", "STEP", "The step shown, of this run's steps"),
    ("blocks_used", "BLOCKS", "Blocks held after that step"),
    ("running", "RUN", "Sequences running after that step"),
    ("waiting", "WAIT", "Sequences waiting (new, or preempted) after that step"),
    ("preemptions", "PREEMPT", "Preemptions so far"),
)
# A step that ended with its running sequences all finished and others waiting: not a stall.
BETWEEN_STEPS_TIP = (
    "Every sequence running in this step finished in it; the next step admits the waiting "
    "ones at once (nothing stalls). The map shows a step's end until the next step ends."
)
# Each tile's share of the row, by what it must show (its caption, a value of a few digits):
# with equal shares "PREEMPT" lost its last letter in a 1024 px window and "RUN" had room to spare.
FIGURE_STRETCH = {"step": 6, "blocks_used": 6, "running": 4, "waiting": 5, "preemptions": 7}


TIPS = {key: tip for key, _caption, tip in FIGURES}


def step_index_at(ends: list[float], t: float) -> int:
    """Index of the last step ended by t; -1 before the first one ends."""
    return bisect.bisect_right(ends, t) - 1


class _Figure(QFrame):
    def __init__(self, caption: str) -> None:
        super().__init__()
        self.setObjectName("tile")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(5, 3, 5, 4)
        layout.setSpacing(0)
        self.caption = QLabel(caption)
        self.caption.setObjectName("caption")
        self.value = QLabel("–")
        self.value.setObjectName("value")
        for w in (self.caption, self.value):
            w.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
            w.setMinimumWidth(1)
            layout.addWidget(w)


class RunSide(QWidget):
    def __init__(self, recorded: bool, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.recorded = recorded
        self.caption = CaptionLabel("Recorded" if recorded else "What if")
        self.map = BlockMapView()
        self.figures = {key: _Figure(caption) for key, caption, _tip in FIGURES}
        for key, _caption, tip in FIGURES:
            self.figures[key].setToolTip(tip)
        row = QHBoxLayout()
        row.setSpacing(4)
        for key, figure in self.figures.items():
            row.addWidget(figure, FIGURE_STRETCH[key])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(3)
        layout.addWidget(self.caption)
        layout.addWidget(self.map, 1)
        layout.addLayout(row)
        self.result: SimResult | None = None
        self.seeker: PoolSeeker | None = None
        self._ends: list[float] = []
        self.shown_step = -1  # the step whose pool the map shows (0: before the first)
        follow_theme(self, self._restyle)

    def _restyle(self, palette: Palette) -> None:
        # The block map's tiles, smaller: five a side fit a 1024 px window's half column.
        sheet = tile_style(palette).replace("font-size: 16px", "font-size: 14px")
        sheet = sheet.replace("font-size: 10px; font-weight", "font-size: 9px; font-weight")
        for figure in self.figures.values():
            figure.setStyleSheet(sheet)
        self.caption.setStyleSheet(f"color: {palette.text}; font-size: 11px;")
        self.map.setBackground(colors.active().background_hex)

    def set_run(
        self, result: SimResult | None, caption: str, seeker: PoolSeeker | None = None
    ) -> None:
        """Show this run (None: nothing to show, e.g. settings that cannot run); `seeker` over
        its events, made here when not given."""
        self.caption.setText(caption)
        self.result = result
        self.shown_step = -1
        if result is None:
            self.seeker, self._ends = None, []
            self.map.set_snapshot(None)
            for figure in self.figures.values():
                figure.value.setText("–")
            return
        if seeker is None:
            # The panel's runs are all simulated with keep_events=True (whatif/jobs.py).
            assert result.events is not None
            seeker = PoolSeeker(result.config, result.events)
        self.seeker = seeker
        self._ends = [s.time + s.duration for s in result.steps]

    def set_caption(self, caption: str) -> None:
        self.caption.setText(caption)

    @property
    def end_time(self) -> float:
        return self._ends[-1] if self._ends else 0.0

    def step_at(self, t: float) -> TracedStep | None:
        if self.result is None:
            return None
        index = step_index_at(self._ends, t)
        return self.result.steps[index] if index >= 0 else None

    def show_at(self, t: float) -> None:
        """The pool and figures after the last step ended by t."""
        if self.seeker is None:
            return
        step = self.step_at(t)
        number = step.step if step is not None else 0
        if number != self.shown_step or self.map.snapshot is None:
            self.map.set_snapshot(self.seeker.at(number))
            self.shown_step = number
        for key, figure in self.figures.items():
            figure.value.setText(f"{getattr(step, key):,}" if step is not None else "0")
        between = step is not None and step.running == 0 and step.waiting > 0
        for key in ("running", "waiting"):
            self.figures[key].setToolTip(BETWEEN_STEPS_TIP if between else TIPS[key])
        self.figures["step"].value.setText(f"{number:,}")
        self.figures["step"].setToolTip(f"The step shown, of this run's {len(self._ends):,}")
