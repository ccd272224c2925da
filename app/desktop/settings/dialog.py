"""SettingsDialog: the model, the engine knobs and the chat policy, edited as one AppSettings.

The settings themselves (records, JSON, validation) are app/core/settings.py; this is only
their dialog, with the model picker and a live prediction of what the engine will hold.
Apply refuses what would fail the build (app/desktop/settings/build_check.py), with the value and
the limit, since a failed rebuild costs the running engine and says so only afterwards; the max
model length is clamped to the chosen model's context and says so, and the user's own length
comes back for a model that allows it (saved as AppSettings.wanted_max_model_len, so in a later
dialog too). A closed dialog deletes itself. When a rebuild failed
anyway, the window reopens the dialog on the settings that failed, not on the ones restored.
"""

from __future__ import annotations

import html
from dataclasses import replace
from typing import Any

from PySide6.QtCore import Qt, SignalInstance
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

from kvscope.app.core.defaults import MAX_MODEL_LEN_HELP
from kvscope.app.core.engine_messages import EngineInfo
from kvscope.app.core.settings import (
    DEVICES,
    KV_BUDGET_HELP,
    OVERFLOW_POLICIES,
    AppSettings,
    EngineSettings,
)
from kvscope.app.desktop.settings.build_check import build_problems, context_limit
from kvscope.engine.config import knob_of
from kvscope.engine.cpu_threads import default_num_threads, usable_cpus

# Rows whose meaning in the app differs from the engine knob's help (the app's defaults).
_DIALOG_HELP = {
    "kv_budget_mib": KV_BUDGET_HELP,
    "max_model_len": f"{MAX_MODEL_LEN_HELP}; \"model's own\" takes the model's context length",
}

# The widget of an engine row: what _value reads and _changed listens to.
EngineRowWidget = QComboBox | QCheckBox | QSpinBox | QDoubleSpinBox


class SettingsDialog(QDialog):
    """Model + engine knobs + chat policy. `result_settings()` after accept gives the new ones."""

    def __init__(
        self,
        settings: AppSettings,
        parent: QWidget | None = None,
        *,
        running: EngineInfo | None = None,
        failed: tuple[EngineSettings, str] | None = None,
    ) -> None:
        """`running`: the engine a rebuild would free first; `failed`: the engine settings of
        the last Apply that did not build and why, which the dialog starts from."""
        from kvscope.app.desktop.models.picker import ModelPicker

        super().__init__(parent)
        self.setWindowTitle("Model and engine settings")
        self.setObjectName("settingsDialog")
        # Freed once closed: the window is its parent and its accepted slot a lambda over it,
        # so a closed dialog stayed alive (with its picker's header copies) until the window.
        # accepted/finished still reach their slots first: the deletion is deferred.
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self._base = settings
        self._freed_bytes = _freed_bytes(running)
        self._failure = failed[1] if failed else ""
        es = failed[0] if failed else settings.engine

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
        # What the user chose, before any model's clamp: a length an earlier dialog lowered
        # comes back from the settings, so a model that allows it gets it again.
        self._wanted_len = _wanted_length(es.max_model_len, settings.wanted_max_model_len)
        self.context_note = QLabel(wordWrap=True)
        self.context_note.setObjectName("contextNote")
        self.max_seqs = QSpinBox(minimum=1, maximum=4096, value=es.max_num_seqs)
        self.prefix = QCheckBox("reuse cached prompt prefixes")
        self.prefix.setChecked(es.enable_prefix_caching)
        self.allocator = _combo(knob_of("allocator").choices, es.allocator)
        self.quantization = _combo(knob_of("quantization").choices, es.quantization)
        self.threads = QSpinBox(minimum=0, maximum=len(usable_cpus()))
        self.threads.setValue(es.num_threads or 0)
        self.threads.setSpecialValueText(f"automatic ({default_num_threads()})")  # 0: None
        # EngineSettings field -> its row's label and widget, in the form's order.
        self._engine_rows: dict[str, tuple[str, EngineRowWidget]] = {
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
        # Its longest choice set the dialog's least width (318 px beside a 230 px label): the
        # box shows 20 characters, its list the whole of each choice.
        self.policy.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.policy.setMinimumContentsLength(20)
        for key, label in OVERFLOW_POLICIES.items():
            self.policy.addItem(label, key)
        self.policy.setCurrentIndex(list(OVERFLOW_POLICIES).index(settings.overflow_policy))

        engine_box = QGroupBox("Engine")
        form = QFormLayout(engine_box)
        for name, (label, widget) in self._engine_rows.items():
            help_text = _DIALOG_HELP.get(name) or knob_of(name).help
            # As rich text, which Qt wraps; plain text would be one long line.
            widget.setToolTip(f"<p>{html.escape(help_text, quote=False)}</p>")
            form.addRow(label, widget)
            if name == "max_model_len":
                form.addRow("", self.context_note)
        chat_box = QGroupBox("Conversations")
        chat_form = QFormLayout(chat_box)
        chat_form.addRow("When a chat outgrows the context", self.policy)

        self.error = QLabel(wordWrap=True)
        self.error.setObjectName("errorText")
        ok, cancel = QDialogButtonBox.StandardButton.Ok, QDialogButtonBox.StandardButton.Cancel
        buttons = QDialogButtonBox(ok | cancel)
        buttons.button(ok).setText("Apply")
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

        self.max_len.valueChanged.connect(self._length_chosen)  # first: the refresh reads it
        for _, widget in self._engine_rows.values():
            _changed(widget).connect(self._refresh_prediction)
        self.picker.model_changed.connect(self._refresh_prediction)
        self._refresh_prediction()

    def engine_settings(self) -> EngineSettings:
        # Each row's value has its field's type (_value), which no one dict type can say.
        values: dict[str, Any] = {
            name: _value(widget) for name, (_, widget) in self._engine_rows.items()
        }
        return EngineSettings(model=self.picker.model_path(), **values)

    def result_settings(self) -> AppSettings:
        engine = self.engine_settings()
        wanted, applied = self._wanted_len, engine.max_model_len
        return replace(
            self._base,
            engine=engine,
            overflow_policy=self.policy.currentData(),
            # Kept only while the model's context holds the applied length below it.
            wanted_max_model_len=wanted if wanted and applied and wanted > applied else None,
        )

    def problems(self) -> list[str]:
        """Why these settings would not build, one sentence each ([]: Apply goes ahead)."""
        settings = self.engine_settings()
        if self.picker.model_path() is None and self.picker.source.currentIndex() != 0:
            return ["Choose a model file or folder, or the bundled model."]
        mc = self.picker.model_config()
        if mc is None and self.picker.error.text():
            return [f"The model at {settings.model} cannot be read: see the message above."]
        return build_problems(settings, mc, self.picker.weights_header(), self._freed_bytes)

    def _length_chosen(self, value: int) -> None:
        """The user's own choice, kept apart from a clamp to a smaller model's context."""
        if not self._clamping:
            self._wanted_len = value or None

    _clamping = False

    def _clamp_length(self) -> None:
        """Max model length at most the chosen model's context, and the note that says so."""
        mc = self.picker.model_config()
        limit = context_limit(mc) if mc is not None else 1 << 20
        wanted = self._wanted_len
        self._clamping = True
        try:
            self.max_len.setMaximum(limit)
            # A larger model lets a clamped choice back up to what the user asked for.
            self.max_len.setValue(min(wanted, limit) if wanted else 0)
        finally:
            self._clamping = False
        if mc is None:
            self.context_note.setText("")
        elif wanted and wanted > limit:
            self.context_note.setText(
                f"This model's context length is {limit:,} tokens: max model length lowered "
                f"from {wanted:,} to {limit:,}."
            )
        else:
            self.context_note.setText(f"At most {limit:,} tokens (this model's context length).")

    def _refresh_prediction(self) -> None:
        if self._clamping:
            return
        self._clamp_length()
        settings = self.engine_settings()
        try:
            on_cpu = settings.engine_config().torch_device.type == "cpu"
        except ValueError:  # e.g. cuda chosen without CUDA: problems() says so right away
            pass
        else:
            # One budget knob applies: MiB on CPU, a share of the GPU on CUDA.
            self.kv_mib.setEnabled(on_cpu)
            self.gpu_util.setEnabled(not on_cpu)
        problems = self.problems()
        failure = f"The last Apply failed: {self._failure}" if self._failure else ""
        self.error.setText("<br>".join(html.escape(p) for p in [failure, *problems] if p))
        self.picker.show_prediction(settings)

    def _accept(self) -> None:
        problems = self.problems()
        try:
            self.result_settings().validate()
        except ValueError as e:
            problems = [str(e), *problems]
        if problems:
            self.error.setText("<br>".join(html.escape(p) for p in problems))
            return
        self.accept()


def _freed_bytes(running: EngineInfo | None) -> int:
    """What a rebuild frees before the new engine loads: the running weights and KV pool."""
    if running is None:
        return 0
    kv = running.num_blocks * running.block_size * running.kv_bytes_per_token
    # A hybrid model's block holds one group's layers: the pool is at most its budget.
    if running.device == "cpu":
        kv = min(kv, running.settings.kv_budget_mib << 20)
    return running.weight_bytes + kv


def _wanted_length(applied: int | None, wanted: int | None) -> int | None:
    """The user's own max model length: the saved one a clamp lowered, when it is over the
    applied one (a stale or hand-edited value under it is not a choice the clamp made)."""
    if wanted is not None and applied is not None and wanted > applied:
        return wanted
    return applied


def _combo(items: tuple, current: object) -> QComboBox:
    """One entry per item, holding the item itself as its data; `current` chosen if listed."""
    combo = QComboBox()
    for item in items:
        combo.addItem(str(item), item)
    if current in items:
        combo.setCurrentIndex(items.index(current))
    return combo


def _value(widget: EngineRowWidget) -> object:
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


def _changed(widget: EngineRowWidget) -> SignalInstance:
    """The signal an engine row's widget sends when the user changes it."""
    if isinstance(widget, QComboBox):
        return widget.currentIndexChanged
    if isinstance(widget, QCheckBox):
        return widget.toggled
    return widget.valueChanged
