"""The app's settings: one object, persisted as JSON under the data dir, and its dialog.

`AppSettings.engine` holds the knobs that need an engine rebuild, `sampling` the defaults for new
replies, `overflow_policy` what happens when a chat outgrows the context. Loading validates
every value once; a bad file raises ValueError naming the key, and the window falls back to
defaults and says so.
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

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

from app.desktop.theme import THEMES
from engine.config import EngineConfig, knob_of, user_knobs
from engine.cpu_threads import default_num_threads, usable_cpus

OVERFLOW_POLICIES = {
    "stop": "Stop with a message",
    "drop_oldest": "Drop the oldest turns (keep the system prompt)",
}
# The devices the dialog offers; EngineConfig also takes "cuda:N".
DEVICES = ("auto", "cpu", "cuda")
# The app's defaults make the paged-vs-naive comparison mean something: 512 MiB of CPU KV hold
# 728 blocks of 16 (float32 KV, 45 KiB/token for the bundled model) to 1,456 (bfloat16), so at
# a 2,048-token context the pool holds 5.7-11 full contexts and the naive allocator fits 5-11
# reservations side by side, while the map stays readable. (The model's own 8,192 would let
# one naive sequence reserve nearly the whole pool.) 2,048 tokens is a long chat for it.
DEFAULT_CPU_KV_MIB = 512
DEFAULT_MAX_MODEL_LEN = 2048
KV_BUDGET_HELP = "the KV pool's size on a CPU; on CUDA, GPU memory utilization sizes it"


@dataclass
class EngineSettings:
    """Knobs whose change rebuilds the engine (the tokenizer is reused unless `model` changes;
    weights are read from the file again). A field named like an EngineConfig knob is that knob
    and reaches it by name; `kv_budget_mib` is the app's own (see engine_config). The names are
    also the keys of the settings file, so they stay."""

    model: str | None = None  # None: the bundled default; else a .gguf file or an HF folder
    device: str = "auto"
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    kv_budget_mib: int = DEFAULT_CPU_KV_MIB  # the KV pool on CPU
    gpu_memory_utilization: float = 0.9  # the KV budget on CUDA
    max_model_len: int | None = DEFAULT_MAX_MODEL_LEN  # None: the model's own context length
    max_num_seqs: int = 64
    enable_prefix_caching: bool = True
    allocator: str = "paged"
    quantization: str = "auto"  # auto: keep a GGUF's own; none; int8/int4 at load
    num_threads: int | None = None  # None: the engine's default (physical cores less one)

    def engine_config(self) -> EngineConfig:
        """The EngineConfig these settings build; raises ValueError on a bad knob."""
        shared = {f.name for f in fields(self)} & {f.name for f in user_knobs()}
        config = EngineConfig(**{name: getattr(self, name) for name in shared})
        if config.torch_device.type != "cpu":
            return config
        # A budget in MiB reads better than bytes in a dialog; on CUDA the pool is sized from
        # gpu_memory_utilization instead, so kv_budget_mib applies on a CPU only.
        return replace(config, kv_cache_memory=self.kv_budget_mib << 20)

    def llm_kwargs(self) -> dict:
        """Keyword arguments for `LLM(model=..., **kwargs)` that build `engine_config()`."""
        config = self.engine_config()
        return {f.name: getattr(config, f.name) for f in user_knobs() if f.name != "model"}


@dataclass
class SamplingSettings:
    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = -1
    max_tokens: int = 256
    seed: int | None = None
    n: int = 1
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    @classmethod
    def from_dict(cls, data: object) -> SamplingSettings:
        """Validated settings from saved JSON (a chat's, the file's); unknown keys are ignored.
        Raises ValueError naming a bad value."""
        from engine import SamplingParams

        settings = _dataclass_from(cls, data, "sampling")
        SamplingParams(**settings.params_kwargs())
        return settings

    def params_kwargs(self) -> dict:
        return asdict(self)


@dataclass
class AppSettings:
    engine: EngineSettings = field(default_factory=EngineSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    overflow_policy: str = "stop"
    theme: str = "system"  # one of app.desktop.theme.THEMES

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> AppSettings:
        """Validated settings; keys this version does not know are ignored (a newer app's)."""
        if not isinstance(data, dict):
            raise ValueError(f"settings must be a JSON object, got {type(data).__name__}")
        engine = _dataclass_from(EngineSettings, data.get("engine", {}), "engine")
        sampling = _dataclass_from(SamplingSettings, data.get("sampling", {}), "sampling")
        policy = data.get("overflow_policy", "stop")
        theme = data.get("theme", "system")
        settings = cls(engine=engine, sampling=sampling, overflow_policy=policy, theme=theme)
        settings.validate()
        return settings

    def validate(self) -> None:
        from engine import SamplingParams

        if self.overflow_policy not in OVERFLOW_POLICIES:
            raise ValueError(
                f"overflow_policy {self.overflow_policy!r} is not one of {tuple(OVERFLOW_POLICIES)}"
            )
        if self.theme not in THEMES:
            raise ValueError(f"theme {self.theme!r} is not one of {THEMES}")
        if not isinstance(self.engine.kv_budget_mib, int) or self.engine.kv_budget_mib < 1:
            raise ValueError(
                f"kv_budget_mib must be an int >= 1, got {self.engine.kv_budget_mib!r}"
            )
        self.engine.engine_config()
        SamplingParams(**self.sampling.params_kwargs())

    def with_engine(self, **changes) -> AppSettings:
        return replace(self, engine=replace(self.engine, **changes))


def _dataclass_from(cls, data: object, name: str):
    if not isinstance(data, dict):
        raise ValueError(f"settings {name!r} must be a JSON object, got {data!r}")
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in known})


def settings_path() -> Path:
    from app.core.paths import data_dir

    return data_dir() / "settings.json"


def load_settings(path: Path | None = None) -> AppSettings:
    """Saved settings, or defaults when none are saved; ValueError (naming the file) if bad."""
    path = path or settings_path()
    if not path.exists():
        return AppSettings()
    try:
        return AppSettings.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from e


def save_settings(settings: AppSettings, path: Path | None = None) -> None:
    path = path or settings_path()
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(settings.to_dict(), indent=2))
    tmp.replace(path)  # atomic: a crash never leaves half a settings file


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
