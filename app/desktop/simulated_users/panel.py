"""LoadGeneratorPanel: the simulated users' settings, and Start / Stop.

Once the engine is known (`set_engine_info`) the lengths are kept within its context, so no
request is refused for its length, and the "Preemption demo" preset fills in a load that
overruns the current pool, sized to this machine's measured speed (`set_speed`), and says when
the first preemption should show. Where filling this pool takes far longer, it offers a smaller
one (`pool_requested`, in MiB) and applies itself again once the engine is rebuilt.
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

from kvscope.app.core.engine_messages import EngineInfo
from kvscope.app.desktop.simulated_users.loadgen import (
    DEMO_TARGET_S,
    MAX_RATE,
    MAX_USERS,
    MIN_PROMPT_TOKENS,
    DemoPlan,
    LoadSpec,
    fit_to_context,
    plan_preemption_demo,
)
from kvscope.app.desktop.simulated_users.step_speed import DEFAULT_SPEED, MachineSpeed

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
    pool_requested = Signal(int)  # a KV pool in MiB the preset would rather run on

    def __init__(self, parent: QWidget | None = None, spec: LoadSpec | None = None) -> None:
        super().__init__(parent)
        spec = spec or LoadSpec()
        self.users = _spin(1, MAX_USERS, spec.num_users)
        self.users.setToolTip("Simulated users; each has one request in flight at most.")
        self._info: EngineInfo | None = None
        self._speed: MachineSpeed = DEFAULT_SPEED
        self._suggested_mib = 0  # the smaller pool the preset offers, 0 when none
        self._preset_after_rebuild = False
        self.prompt = _RangeRow(MIN_PROMPT_TOKENS, MAX_PROMPT_TOKENS, *spec.prompt_tokens)
        self.prompt.setToolTip("Prompt length of each request, drawn uniformly (approximate).")
        self.output = _RangeRow(1, MAX_OUTPUT_TOKENS, *spec.output_tokens)
        self.output.setToolTip("Tokens generated per request (end-of-sequence is ignored).")
        self.shared = QCheckBox("All users share one long system prompt")
        self.shared.setChecked(spec.shared_system_prompt)
        self.shared.setToolTip("The prefix cache then serves it from shared blocks.")
        self.rate = QDoubleSpinBox()
        self.rate.setRange(0.01, MAX_RATE)
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
        self.smaller_pool = QPushButton("")
        self.smaller_pool.setToolTip("Rebuild the engine with this KV pool (saved as in Settings).")
        self.smaller_pool.clicked.connect(self._request_smaller_pool)
        self.smaller_pool.hide()
        self.limit = QLabel("")
        self.limit.setWordWrap(True)
        self.limit.setStyleSheet("color: #8C94A3;")
        self.start = QPushButton("Start load")
        self.stop = QPushButton("Stop")
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.status.hide()  # an empty line would still take its height from the block maps
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
        # What the preset will do (and the smaller pool it offers) right under its inputs: the
        # pane is short, and what lies further down needs scrolling to.
        layout.addWidget(self.status)
        layout.addWidget(self.smaller_pool)
        layout.addLayout(buttons)
        layout.addWidget(self.limit)
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
        self.smaller_pool.hide()
        if self._preset_after_rebuild:  # the smaller pool it asked for: size the load to it
            self._preset_after_rebuild = False
            self.apply_preemption_demo()

    def set_speed(self, speed: MachineSpeed) -> None:
        """This machine's prefill and decode speed, as the worker measured it."""
        self._speed = speed

    def preemption_plan(self) -> DemoPlan | None:
        info = self._info
        if info is None:
            return None
        return plan_preemption_demo(
            info.num_blocks,
            info.block_size,
            info.max_seq_len,
            info.settings.max_num_seqs,
            self._speed,
        )

    def apply_preemption_demo(self) -> None:
        plan = self.preemption_plan()
        if plan is None:
            return
        self.set_spec(plan.spec)
        self.set_status(describe_plan(plan, self._speed))
        self._suggested_mib = self._pool_mib(plan.suggested_pool_tokens)
        self.smaller_pool.setVisible(self._suggested_mib > 0)
        self.smaller_pool.setText(f"Use a {self._suggested_mib:,} MiB KV pool for this demo")

    def _pool_mib(self, tokens: int | None) -> int:
        """The CPU pool budget holding `tokens` (0: none to offer; on a GPU the pool is sized
        from gpu_memory_utilization, so no MiB figure applies)."""
        info = self._info
        if tokens is None or info is None or info.device != "cpu" or not info.kv_bytes_per_token:
            return 0
        mib = max(1, tokens * info.kv_bytes_per_token >> 20)
        return mib if mib < info.settings.kv_budget_mib else 0

    def _request_smaller_pool(self) -> None:
        if self._suggested_mib:
            self._preset_after_rebuild = True
            self.smaller_pool.hide()
            self.set_status(f"Rebuilding the engine with a {self._suggested_mib:,} MiB pool…")
            self.pool_requested.emit(self._suggested_mib)

    def set_running(self, running: bool) -> None:
        """Reflect whether the load runs: settings lock while it does."""
        self.start.setEnabled(not running)
        self.stop.setEnabled(running)
        for w in self._inputs:
            w.setEnabled(not running)
        self.preset.setEnabled(not running and self._info is not None)

    def set_status(self, text: str) -> None:
        self.status.setText(text)
        self.status.setVisible(bool(text))

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


def describe_plan(plan: DemoPlan, speed: MachineSpeed) -> str:
    """What the preset will do and when to expect it, in figures."""
    spec = plan.spec
    when = plan.first_preemption_s
    head = f"Preset: {spec.num_users} users, prompts filling most of the pool, then replies"
    if when == float("inf"):
        text = (
            f"{head} that cannot overrun it: {spec.num_users} users of a full context hold"
            f" less than its {plan.pool_tokens:,} tokens."
        )
    else:
        text = (
            f"{head} that overrun it. First preemption in about {_seconds(when)} after Start"
            f" ({_seconds(plan.prefill_s)} of prefill); watch the preempted count."
        )
    if plan.suggested_pool_tokens:
        tokens = plan.suggested_pool_tokens
        text += f" A pool of {tokens:,} tokens would show it in about {DEMO_TARGET_S:.0f} s."
    return f"{text}\nSpeed: {speed.describe()}."


def _seconds(s: float) -> str:
    return f"{s:,.0f} s" if s >= 2 else f"{max(s, 0.1):.1f} s"
