"""LoadGeneratorPanel: the simulated users' settings, and Start / Stop.

Once the engine is known (`set_engine_info`) the lengths are kept within its context, so no
request is refused for its length, and the "Preemption demo" preset fills in a load that
overruns the current pool.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QBoxLayout,
    QCheckBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLayout,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core.engine_messages import EngineInfo
from app.core.loadgen import MAX_USERS, MIN_PROMPT_TOKENS, LoadSpec, fit_to_context, preemption_demo

MAX_PROMPT_TOKENS = 32768
MAX_OUTPUT_TOKENS = 8192


def _spin(low: int, high: int, value: int, suffix: str = "") -> QSpinBox:
    box = QSpinBox()
    box.setRange(low, high)
    box.setValue(value)
    box.setSuffix(suffix)
    box.setAccelerated(True)
    return box


class _RangeRow(QWidget):
    """Two linked spin boxes, min and max: moving one past the other drags it along."""

    def __init__(self, low: int, high: int, lo_value: int, hi_value: int) -> None:
        super().__init__()
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.low = _spin(low, high, lo_value)
        self.high = _spin(low, high, hi_value)
        layout.addWidget(self.low, 1)
        layout.addWidget(QLabel("to"))
        layout.addWidget(self.high, 1)
        layout.addWidget(QLabel("tokens"))
        self.low.valueChanged.connect(lambda v: self.high.setValue(max(v, self.high.value())))
        self.high.valueChanged.connect(lambda v: self.low.setValue(min(v, self.low.value())))

    def value(self) -> tuple[int, int]:
        return self.low.value(), self.high.value()

    def set_maximum(self, high: int) -> None:
        self.low.setMaximum(high)
        self.high.setMaximum(high)

    def set_value(self, value: tuple[int, int]) -> None:
        self.high.setValue(value[1])
        self.low.setValue(value[0])


class LoadGeneratorPanel(QWidget):
    start_requested = Signal(object)  # LoadSpec
    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None, spec: LoadSpec | None = None) -> None:
        super().__init__(parent)
        spec = spec or LoadSpec()
        self.users = _spin(1, MAX_USERS, spec.num_users)
        self.users.setToolTip("Simulated users; each has one request in flight at most.")
        self._info: EngineInfo | None = None
        self.prompt = _RangeRow(MIN_PROMPT_TOKENS, MAX_PROMPT_TOKENS, *spec.prompt_tokens)
        self.prompt.setToolTip("Prompt length of each request, drawn uniformly (approximate).")
        self.output = _RangeRow(1, MAX_OUTPUT_TOKENS, *spec.output_tokens)
        self.output.setToolTip("Tokens generated per request (end-of-sequence is ignored).")
        self.shared = QCheckBox("All users share one long system prompt")
        self.shared.setChecked(spec.shared_system_prompt)
        self.shared.setToolTip("The prefix cache then serves it from shared blocks.")
        self.rate = QDoubleSpinBox()
        self.rate.setRange(0.01, 100.0)
        self.rate.setDecimals(2)
        self.rate.setSingleStep(0.25)
        self.rate.setSuffix(" requests/s")
        self.rate.setValue(spec.arrival_rate_per_s)
        self.rate.setToolTip(
            "Poisson arrival rate while all users are thinking; each user waits a random think"
            " time (mean users / rate) after its request finishes."
        )
        self.seed = _spin(0, 2**31 - 1, spec.seed)
        self.seed.setToolTip("Same seed, same requests: each user's k-th request is fixed.")

        self.preset = QPushButton("Preemption demo")
        self.preset.setToolTip(
            "Fill in a load this pool cannot hold: many users with long outputs, arriving"
            " together. Their prompts fit, their replies do not, so the engine preempts."
        )
        self.preset.setEnabled(False)  # sized from the engine's pool: known once it is up
        self.preset.clicked.connect(self.apply_preemption_demo)
        self.limit = QLabel("")
        self.limit.setWordWrap(True)
        self.limit.setStyleSheet("color: #8C94A3;")
        self.start = QPushButton("Start load")
        self.stop = QPushButton("Stop")
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.start.clicked.connect(self._on_start)
        self.stop.clicked.connect(self._on_stop)

        # Two short columns, not one tall one: the pane shares its height with the block maps.
        who = QFormLayout()
        who.addRow("Users", self.users)
        who.addRow("Arrival rate", self.rate)
        who.addRow("Seed", self.seed)
        who.addRow("Preset", self.preset)
        lengths = QFormLayout()
        lengths.addRow("Prompt", self.prompt)
        lengths.addRow("Output", self.output)
        lengths.addRow("", self.shared)
        for form in (who, lengths):  # else they inherit the columns' 16 px gap between rows
            form.setVerticalSpacing(4)
            form.setHorizontalSpacing(8)
        self.columns = QBoxLayout(QBoxLayout.Direction.LeftToRight)
        self.columns.setSpacing(16)
        self.columns.addLayout(who, 2)
        self.columns.addLayout(lengths, 3)
        buttons = QHBoxLayout()
        buttons.addWidget(self.start)
        buttons.addWidget(self.stop)
        layout = QVBoxLayout(self)
        layout.setSpacing(4)
        layout.addLayout(self.columns)
        layout.addWidget(self.limit)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        layout.addStretch(1)
        self._inputs = (
            self.users, self.prompt, self.output, self.shared, self.rate, self.seed, self.preset
        )  # fmt: skip
        self.set_running(False)
        # It may narrow to one column's width; the columns' own minimum must not pin it wider.
        layout.setSizeConstraint(QLayout.SizeConstraint.SetNoConstraint)
        margins = layout.contentsMargins().left() + layout.contentsMargins().right()
        widths = [form.minimumSize().width() for form in (who, lengths)]
        self._two_columns_width = sum(widths) + self.columns.spacing() + margins
        self._one_column_width = max(widths) + margins

    def minimumSizeHint(self) -> QSize:
        return QSize(self._one_column_width, super().minimumSizeHint().height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        """Side by side where they fit, one column where they do not (a 1024 px window)."""
        super().resizeEvent(event)
        side_by_side = event.size().width() >= self._two_columns_width
        direction = (
            QBoxLayout.Direction.LeftToRight if side_by_side else QBoxLayout.Direction.TopToBottom
        )
        if self.columns.direction() != direction:
            self.columns.setDirection(direction)

    def spec(self) -> LoadSpec:
        return LoadSpec(
            num_users=self.users.value(),
            prompt_tokens=self.prompt.value(),
            output_tokens=self.output.value(),
            shared_system_prompt=self.shared.isChecked(),
            arrival_rate_per_s=self.rate.value(),
            seed=self.seed.value(),
        )

    def set_spec(self, spec: LoadSpec) -> None:
        self.users.setValue(spec.num_users)
        self.prompt.set_value(spec.prompt_tokens)
        self.output.set_value(spec.output_tokens)
        self.shared.setChecked(spec.shared_system_prompt)
        self.rate.setValue(spec.arrival_rate_per_s)
        self.seed.setValue(spec.seed)

    def set_engine_info(self, info: EngineInfo) -> None:
        """Keep lengths within this engine's context and size the preset to its pool."""
        self._info = info
        self.prompt.set_maximum(max(MIN_PROMPT_TOKENS, info.max_seq_len))
        self.output.set_maximum(max(1, info.max_seq_len))
        self.set_spec(fit_to_context(self.spec(), info.max_seq_len))
        self.limit.setText(
            f"Prompt + output are kept within {info.max_seq_len:,} tokens (max model length"
            f" {info.max_model_len:,}, pool {info.num_blocks:,} blocks × {info.block_size})."
        )
        self.preset.setEnabled(self.start.isEnabled())

    def apply_preemption_demo(self) -> None:
        info = self._info
        if info is None:
            return
        spec = preemption_demo(
            info.num_blocks, info.block_size, info.max_seq_len, info.settings.max_num_seqs
        )
        self.set_spec(spec)
        self.set_status(
            f"Preset: {spec.num_users} users whose replies need about twice the pool;"
            " press Start and watch the preempted count."
        )

    def set_running(self, running: bool) -> None:
        """Reflect whether the load runs: settings lock while it does."""
        self.start.setEnabled(not running)
        self.stop.setEnabled(running)
        for w in self._inputs:
            w.setEnabled(not running)
        self.preset.setEnabled(not running and self._info is not None)

    def set_status(self, text: str) -> None:
        self.status.setText(text)

    def _on_start(self) -> None:
        try:
            spec = self.spec()
            if self._info is not None:
                spec = fit_to_context(spec, self._info.max_seq_len)
        except ValueError as e:  # the boxes' ranges should prevent it; say so if not
            self.set_status(str(e))
            return
        self.set_running(True)
        self.start_requested.emit(spec)

    def _on_stop(self) -> None:
        self.set_running(False)
        self.stop_requested.emit()
