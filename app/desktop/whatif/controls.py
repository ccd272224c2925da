"""WhatIfControls: a widget per WhatIf knob, starting at the recording's values.

`what()` is the WhatIf they come to: a knob left at (or put back to) its recorded value is
None, so an untouched panel replays the recording itself and its captions say "as recorded".
The pool is held in bytes (the spin box shows MiB, rounded): its slider is log-scaled from one
block of the recorded layout to four recorded pools, and the spin box also takes less than a
block, which the panel answers with resolve()'s error.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLayout,
    QPushButton,
    QSlider,
    QSpinBox,
    QWidget,
)

from kvscope.app.desktop.whatif import knobs
from kvscope.engine.config import ALLOCATORS, BLOCK_SIZES
from kvscope.engine.trace import TraceSettings
from kvscope.engine.whatif import SimConfig, WhatIf

# The what-if's KV dtype names -> the torch name a trace records.
KV_DTYPE_NAMES = {
    "fp8": "float8_e4m3fn",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float32": "float32",
}
POOL_TIP = (
    "The KV pool in bytes, as the engine sizes it: a block size or KV dtype change keeps the "
    "bytes and changes how many blocks fit. The slider runs from one block to four times the "
    "recorded pool; type a value for anything else."
)


class WhatIfControls(QWidget):
    changed = Signal()  # any knob moved (the panel debounces)
    reset_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.settings: TraceSettings | None = None
        self.recorded: SimConfig | None = None
        self._pool_bytes: int | None = None  # None: as recorded
        self.pool_slider = QSlider(Qt.Orientation.Horizontal)
        self.pool_slider.setObjectName("whatifPool")
        self.pool_slider.setRange(0, knobs.SLIDER_STEPS)
        self.pool_spin = QDoubleSpinBox(suffix=" MiB")
        self.pool_spin.setObjectName("whatifPoolMiB")
        self.pool_spin.setRange(0.0001, 1 << 20)
        self.pool_spin.setKeyboardTracking(False)
        self.pool_note = QLabel()
        self.pool_note.setObjectName("whatifPoolNote")
        for w in (self.pool_slider, self.pool_spin, self.pool_note):
            w.setToolTip(POOL_TIP)
        self.block_size = QComboBox()
        self.block_size.setObjectName("whatifBlockSize")
        for size in BLOCK_SIZES:
            self.block_size.addItem(f"{size} tokens", size)
        self.kv_dtype = QComboBox()
        self.kv_dtype.setObjectName("whatifKvDtype")
        self.kv_dtype.setToolTip("The KV cache's element type: fp8 holds twice bfloat16's blocks")
        self.allocator = QComboBox()
        self.allocator.setObjectName("whatifAllocator")
        for name in ALLOCATORS:
            self.allocator.addItem(name, name)
        self.allocator.setToolTip("paged: blocks on demand; contiguous: a max-length reservation")
        self.max_seqs = QSpinBox(minimum=1, maximum=4096)
        self.max_seqs.setObjectName("whatifMaxSeqs")
        self.max_seqs.setToolTip("max_num_seqs: sequences batched together at most")
        self.max_len = QSpinBox(minimum=2, singleStep=64)
        self.max_len.setObjectName("whatifMaxLen")
        self.max_len.setToolTip("max_model_len: a prompt longer than this is refused")
        self.prefix = QCheckBox("Prefix caching")
        self.prefix.setObjectName("whatifPrefix")
        self.windows = QCheckBox("Honour sliding windows")
        self.windows.setObjectName("whatifWindows")
        self.rate_slider = QSlider(Qt.Orientation.Horizontal)
        self.rate_slider.setObjectName("whatifRate")
        self.rate_slider.setRange(0, knobs.RATE_STEPS)
        self.rate_label = QLabel("×1.00")
        self.rate_label.setObjectName("whatifRateLabel")
        self.rate_label.setMinimumWidth(self.rate_label.fontMetrics().horizontalAdvance("×0.00 "))
        for w in (self.rate_slider, self.rate_label):
            w.setToolTip("The same requests arriving this many times as fast (x0.5 to x4)")
        self.reset = QPushButton("As recorded")
        self.reset.setObjectName("whatifReset")
        self.reset.setToolTip("Every knob back to the recording's value")
        self._layout()
        self._connect()

    def _layout(self) -> None:
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setHorizontalSpacing(8)
        grid.setVerticalSpacing(4)
        pool = QHBoxLayout()
        pool.addWidget(self.pool_slider, 1)
        pool.addWidget(self.pool_spin)
        pool.addWidget(self.pool_note)
        grid.addWidget(QLabel("KV pool"), 0, 0)
        grid.addLayout(pool, 0, 1, 1, 5)
        rows: tuple[tuple[tuple[str, QWidget | QLayout], ...], ...] = (
            (
                ("Block size", self.block_size),
                ("KV dtype", self.kv_dtype),
                ("Allocator", self.allocator),
            ),
            (
                ("Max seqs", self.max_seqs),
                ("Max length", self.max_len),
                ("Arrivals", self._rate_row()),
            ),
        )
        for r, row in enumerate(rows, start=1):
            for c, (label, widget) in enumerate(row):
                grid.addWidget(QLabel(label), r, 2 * c)
                if isinstance(widget, QWidget):
                    grid.addWidget(widget, r, 2 * c + 1)
                else:
                    grid.addLayout(widget, r, 2 * c + 1)
        checks = self._buttons = QHBoxLayout()
        checks.addWidget(self.prefix)
        checks.addWidget(self.windows)
        checks.addStretch(1)
        checks.addWidget(self.reset)
        grid.addLayout(checks, 3, 0, 1, 6)
        for c in (1, 3, 5):
            grid.setColumnStretch(c, 1)

    def add_button(self, button: QWidget) -> None:
        """A button at the end of the checkboxes' row (the panel's Apply)."""
        self._buttons.addWidget(button)

    def _rate_row(self) -> QHBoxLayout:
        row = QHBoxLayout()
        row.addWidget(self.rate_slider, 1)
        row.addWidget(self.rate_label)
        return row

    def _connect(self) -> None:
        self.pool_slider.valueChanged.connect(self._pool_slid)
        self.pool_spin.valueChanged.connect(self._pool_typed)
        self.rate_slider.valueChanged.connect(self._rate_moved)
        for combo in (self.block_size, self.kv_dtype, self.allocator):
            combo.currentIndexChanged.connect(self.changed)
        for spin in (self.max_seqs, self.max_len):
            spin.valueChanged.connect(self.changed)
        for box in (self.prefix, self.windows):
            box.toggled.connect(self.changed)
        self.reset.clicked.connect(self._reset_clicked)

    # ---- the recording's values -----------------------------------------------------------
    def set_recording(self, settings: TraceSettings, recorded: SimConfig) -> None:
        """Ranges from the recording, every knob at its recorded value (no `changed`)."""
        self.settings, self.recorded = settings, recorded
        widgets = self.findChildren(QWidget)
        for w in widgets:
            w.blockSignals(True)
        try:
            self._pool_bytes = None
            decimals = knobs.mib_decimals(recorded.bytes_per_block)
            self.pool_spin.setDecimals(decimals)
            self.pool_spin.setMinimum(10.0**-decimals)
            self._show_pool(recorded.pool_bytes)
            self.block_size.setCurrentIndex(self.block_size.findData(settings.block_size))
            self.kv_dtype.clear()
            self.kv_dtype.addItem(f"as recorded ({settings.kv_dtype})", "auto")
            for name in KV_DTYPE_NAMES:
                self.kv_dtype.addItem(name, name)
            self.allocator.setCurrentIndex(self.allocator.findData(settings.allocator))
            self.max_seqs.setValue(settings.max_num_seqs)
            self.max_len.setMaximum(settings.model_context)
            self.max_len.setValue(settings.max_model_len)
            self.prefix.setChecked(settings.enable_prefix_caching)
            sliding = knobs.has_sliding_layers(settings)
            self.windows.setChecked(settings.release_window_blocks and sliding)
            self.windows.setEnabled(sliding)
            self.windows.setToolTip(
                "Sliding-window layers give back the blocks that fell out of their window"
                if sliding
                else "This model has no sliding-window layers: nothing to give back"
            )
            self.rate_slider.setValue(knobs.rate_position(1.0))
            self.rate_label.setText("×1.00")
        finally:
            for w in widgets:
                w.blockSignals(False)

    def _reset_clicked(self) -> None:
        if self.settings is not None and self.recorded is not None:  # set together
            self.set_recording(self.settings, self.recorded)
            self.changed.emit()

    # ---- the pool ------------------------------------------------------------------------
    def set_pool_bytes(self, pool: int) -> None:
        """Set the pool (bytes) as a user would; emits `changed`."""
        self._pool_bytes = pool
        self._show_pool(pool)
        self.changed.emit()

    def pool_bytes(self) -> int:
        if self._pool_bytes is not None:
            return self._pool_bytes
        return self.recorded.pool_bytes if self.recorded is not None else 0

    def _show_pool(self, pool: int) -> None:
        assert self.recorded is not None  # the knobs are shown once set_recording has run
        for w in (self.pool_slider, self.pool_spin):
            w.blockSignals(True)
        low, high = knobs.pool_range(self.recorded)
        self.pool_slider.setValue(knobs.log_position(pool, low, high))
        self.pool_spin.setValue(pool / knobs.MIB)
        for w in (self.pool_slider, self.pool_spin):
            w.blockSignals(False)

    def _pool_slid(self, position: int) -> None:
        if self.recorded is None:
            return
        self._pool_bytes = round(knobs.log_value(position, *knobs.pool_range(self.recorded)))
        self.pool_spin.blockSignals(True)
        self.pool_spin.setValue(self._pool_bytes / knobs.MIB)
        self.pool_spin.blockSignals(False)
        self.changed.emit()

    def _pool_typed(self, mib: float) -> None:
        if self.recorded is None:
            return
        self._pool_bytes = round(mib * knobs.MIB)
        self.pool_slider.blockSignals(True)
        low, high = knobs.pool_range(self.recorded)
        self.pool_slider.setValue(knobs.log_position(self._pool_bytes, low, high))
        self.pool_slider.blockSignals(False)
        self.changed.emit()

    def _rate_moved(self, position: int) -> None:
        self.rate_label.setText(f"×{knobs.rate_of(position):.2f}")
        self.changed.emit()

    # ---- what they come to ---------------------------------------------------------------
    def what(self) -> WhatIf:
        s, recorded = self.settings, self.recorded
        if s is None or recorded is None:  # set together: no recording yet
            return WhatIf()

        def unless(value, as_recorded):
            return None if value == as_recorded else value

        dtype = self.kv_dtype.currentData() or "auto"
        if KV_DTYPE_NAMES.get(dtype) == s.kv_dtype:
            dtype = "auto"
        position = self.rate_slider.value()
        rate = 1.0 if position == knobs.rate_position(1.0) else knobs.rate_of(position)
        return WhatIf(
            kv_pool=unless(self.pool_bytes(), recorded.pool_bytes),
            block_size=unless(self.block_size.currentData(), s.block_size),
            kv_dtype=dtype,
            max_num_seqs=unless(self.max_seqs.value(), s.max_num_seqs),
            max_model_len=unless(self.max_len.value(), s.max_model_len),
            prefix_caching=unless(self.prefix.isChecked(), s.enable_prefix_caching),
            allocator=unless(self.allocator.currentData(), s.allocator),
            honour_windows=(
                unless(self.windows.isChecked(), s.release_window_blocks)
                if self.windows.isEnabled()
                else None
            ),
            rate_scale=rate,
        )
