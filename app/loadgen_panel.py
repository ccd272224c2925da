"""LoadGeneratorPanel: the simulated users' settings, and Start / Stop."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.loadgen import MAX_USERS, LoadSpec

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
        self.prompt = _RangeRow(16, MAX_PROMPT_TOKENS, *spec.prompt_tokens)
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

        self.start = QPushButton("Start load")
        self.stop = QPushButton("Stop")
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.start.clicked.connect(self._on_start)
        self.stop.clicked.connect(self._on_stop)

        form = QFormLayout()
        form.addRow("Users", self.users)
        form.addRow("Prompt", self.prompt)
        form.addRow("Output", self.output)
        form.addRow("", self.shared)
        form.addRow("Arrival rate", self.rate)
        form.addRow("Seed", self.seed)
        buttons = QHBoxLayout()
        buttons.addWidget(self.start)
        buttons.addWidget(self.stop)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        layout.addStretch(1)
        self._inputs = (self.users, self.prompt, self.output, self.shared, self.rate, self.seed)
        self.set_running(False)

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

    def set_running(self, running: bool) -> None:
        """Reflect whether the load runs: settings lock while it does."""
        self.start.setEnabled(not running)
        self.stop.setEnabled(running)
        for w in self._inputs:
            w.setEnabled(not running)

    def set_status(self, text: str) -> None:
        self.status.setText(text)

    def _on_start(self) -> None:
        try:
            spec = self.spec()
        except ValueError as e:  # the boxes' ranges should prevent it; say so if not
            self.set_status(str(e))
            return
        self.set_running(True)
        self.start_requested.emit(spec)

    def _on_stop(self) -> None:
        self.set_running(False)
        self.stop_requested.emit()
