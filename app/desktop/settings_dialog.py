"""SettingsDialog: the model, the engine knobs and the chat policy, edited as one AppSettings.

The settings themselves (records, JSON, validation) are app/core/settings.py; this is only
their dialog, with the model picker and a live prediction of what the engine will hold.
"""

from __future__ import annotations

import html
from dataclasses import replace

from PySide6.QtCore import SignalInstance
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core.settings import (
    DEVICES,
    KV_BUDGET_HELP,
    OVERFLOW_POLICIES,
    AppSettings,
    EngineSettings,
)
from engine.config import knob_of
from engine.cpu_threads import default_num_threads, usable_cpus


class SettingsDialog(QDialog):
    """Model + engine knobs + chat policy. `result_settings()` after accept gives the new ones."""

    def __init__(self, settings: AppSettings, parent: QWidget | None = None) -> None:
        from app.desktop.model_picker import ModelPicker

        super().__init__(parent)
        self.setWindowTitle("Model and engine settings")
        self.setObjectName("settingsDialog")
        self._base = settings
        es = settings.engine

        self.picker = ModelPicker(es.model)
        self.device = _combo(DEVICES, es.device)
        self.dtype = _combo(knob_of("dtype").choices, es.dtype)
        self.kv_dtype = _combo(knob_of("kv_cache_dtype").choices, es.kv_cache_dtype)
        self.block_size = _combo(knob_of("block_size").choices, es.block_size)
        self.kv_mib = QSpinBox(minimum=1, maximum=1 << 20, value=es.kv_budget_mib, suffix=" MiB")
        self.gpu_util = QDoubleSpinBox(
            minimum=0.05, maximum=1.0, singleStep=0.05, decimals=2, value=es.gpu_memory_utilization
        )
        self.max_len = QSpinBox(minimum=0, maximum=1 << 20, value=es.max_model_len or 0)
        self.max_len.setSpecialValueText("model's own")  # 0 reads back as None
        self.max_seqs = QSpinBox(minimum=1, maximum=4096, value=es.max_num_seqs)
        self.prefix = QCheckBox("reuse cached prompt prefixes", checked=es.enable_prefix_caching)
        self.allocator = _combo(knob_of("allocator").choices, es.allocator)
        self.quantization = _combo(knob_of("quantization").choices, es.quantization)
        self.threads = QSpinBox(minimum=0, maximum=len(usable_cpus()))
        self.threads.setValue(es.num_threads or 0)
        self.threads.setSpecialValueText(f"automatic ({default_num_threads()})")  # 0: None
        # EngineSettings field -> its row's label and widget, in the form's order.
        self._engine_rows = {
            "device": ("Device", self.device),
            "dtype": ("Weights dtype", self.dtype),
            "quantization": ("Weight quantization", self.quantization),
            "kv_cache_dtype": ("KV cache dtype", self.kv_dtype),
            "block_size": ("Block size (tokens)", self.block_size),
            "kv_budget_mib": ("KV budget on CPU", self.kv_mib),
            "gpu_memory_utilization": ("GPU memory utilization", self.gpu_util),
            "max_model_len": ("Max model length", self.max_len),
            "max_num_seqs": ("Max sequences", self.max_seqs),
            "enable_prefix_caching": ("Prefix caching", self.prefix),
            "allocator": ("Allocator", self.allocator),
            "num_threads": ("CPU threads", self.threads),
        }
        self.policy = QComboBox()
        for key, label in OVERFLOW_POLICIES.items():
            self.policy.addItem(label, key)
        self.policy.setCurrentIndex(list(OVERFLOW_POLICIES).index(settings.overflow_policy))

        engine_box = QGroupBox("Engine")
        form = QFormLayout(engine_box)
        for name, (label, widget) in self._engine_rows.items():
            help_text = KV_BUDGET_HELP if name == "kv_budget_mib" else knob_of(name).help
            # As rich text, which Qt wraps; plain text would be one long line.
            widget.setToolTip(f"<p>{html.escape(help_text, quote=False)}</p>")
            form.addRow(label, widget)
        chat_box = QGroupBox("Conversations")
        chat_form = QFormLayout(chat_box)
        chat_form.addRow("When a chat outgrows the context", self.policy)

        self.error = QLabel(objectName="errorText", wordWrap=True)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.button(QDialogButtonBox.Ok).setText("Apply")
        buttons.accepted.connect(self._accept)
        buttons.rejected.connect(self.reject)

        right = QVBoxLayout()
        right.addWidget(engine_box)
        right.addWidget(chat_box)
        right.addStretch(1)
        columns = QHBoxLayout()
        columns.addWidget(self.picker, 1)
        columns.addLayout(right, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(columns)
        layout.addWidget(self.error)
        layout.addWidget(buttons)

        for _, widget in self._engine_rows.values():
            _changed(widget).connect(self._refresh_prediction)
        self.picker.model_changed.connect(self._refresh_prediction)
        self._refresh_prediction()

    def engine_settings(self) -> EngineSettings:
        values = {name: _value(widget) for name, (_, widget) in self._engine_rows.items()}
        return EngineSettings(model=self.picker.model_path(), **values)

    def result_settings(self) -> AppSettings:
        return replace(
            self._base, engine=self.engine_settings(), overflow_policy=self.policy.currentData()
        )

    def _refresh_prediction(self) -> None:
        settings = self.engine_settings()
        try:
            on_cpu = settings.engine_config().torch_device.type == "cpu"
        except ValueError as e:  # e.g. cuda chosen without CUDA: say so right away
            self.error.setText(str(e))
        else:
            self.error.setText("")
            # One budget knob applies: MiB on CPU, a share of the GPU on CUDA.
            self.kv_mib.setEnabled(on_cpu)
            self.gpu_util.setEnabled(not on_cpu)
        self.picker.show_prediction(settings)

    def _accept(self) -> None:
        try:
            self.result_settings().validate()
        except ValueError as e:
            self.error.setText(str(e))
            return
        self.accept()


def _combo(items: tuple, current: object) -> QComboBox:
    """One entry per item, holding the item itself as its data; `current` chosen if listed."""
    combo = QComboBox()
    for item in items:
        combo.addItem(str(item), item)
    if current in items:
        combo.setCurrentIndex(items.index(current))
    return combo


def _value(widget: QWidget) -> object:
    """The value an engine row's widget holds, as EngineSettings takes it."""
    if isinstance(widget, QComboBox):
        return widget.currentData()
    if isinstance(widget, QCheckBox):
        return widget.isChecked()
    if isinstance(widget, QDoubleSpinBox):
        return round(widget.value(), widget.decimals())
    if widget.specialValueText() and widget.value() == widget.minimum():
        return None  # the spin box shows its special text ("model's own")
    return widget.value()


def _changed(widget: QWidget) -> SignalInstance:
    """The signal an engine row's widget sends when the user changes it."""
    if isinstance(widget, QComboBox):
        return widget.currentIndexChanged
    if isinstance(widget, QCheckBox):
        return widget.toggled
    return widget.valueChanged
