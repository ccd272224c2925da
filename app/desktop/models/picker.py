"""ModelPicker: choose the bundled model, a GGUF file or an HF folder, and see what it costs.

It reads only the model's headers (a GGUF header or config.json and safetensors headers, no
weights) and asks the planner what the chosen engine settings give: the weights in the form the
engine will keep them (format, bytes, the load peak, against the memory that is free), KV bytes
per token, blocks and tokens in the pool. The headers are cached per version of the file
(app/desktop/models/headers.py): a reopen reads nothing. Below the path it lists the GGUF files
already on this computer (app/desktop/models/found_models.py), so a model from LM Studio, GPT4All or
Ollama is one click away. Browse… takes a .gguf or an Ollama blob (hash-named, no suffix: GGUF
by its magic). "Get a model…" closes the dialog and opens the window's Engine ▸ Get a model…
(app/desktop/get_model/): the dialog is window-modal, so that window would wait behind it.
"""

from __future__ import annotations

import html

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.core import paths
from kvscope.app.desktop.blockmap.pool_fit import prediction_line
from kvscope.app.desktop.blockmap.pool_sentence import block_sentence, pool_figures, pool_sentence
from kvscope.app.desktop.elided_label import elide_middle
from kvscope.app.desktop.models import discovery as model_discovery
from kvscope.app.desktop.models.found_models import FoundModelsList
from kvscope.app.desktop.models.headers import read_headers
from kvscope.app.desktop.models.ollama import name_of_blob
from kvscope.engine.model.gguf.identity import is_gguf_file
from kvscope.engine.model.model_config import ModelConfig
from kvscope.engine.sizing import planner
from kvscope.engine.sizing.weight_fit import (
    WeightsHeader,
    count_parameters,
    resolve_for_weights,
    weight_fit,
)

SOURCES = ("Bundled SmolLM2-135M-Instruct", "GGUF file", "HF model folder")
GGUF_FILTERS = "GGUF (*.gguf);;Ollama blobs (sha256-*);;All files (*)"
TITLE_CHARS = 44  # a longer model name is elided in the middle: the quantization suffix stays
MIN_WIDTH = 380  # the found list's names stay readable ("gemma-3-2…-Q4_K_M.gguf")
GET_MODEL_ACTION = "getModelAction"  # the main window's Engine ▸ Get a model… (by its name)


def format_count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


class ModelPicker(QGroupBox):
    model_changed = Signal()

    def __init__(self, model: str | None, parent: QWidget | None = None) -> None:
        super().__init__("Model", parent)
        self.source = QComboBox()
        self.source.addItems(SOURCES)
        self.path = QLineEdit(placeholderText="path to a .gguf file or an HF model folder")
        self.browse = QPushButton("Browse…")
        self.info = QLabel(wordWrap=True)
        self.info.setObjectName("modelInfo")
        self.prediction = QLabel(wordWrap=True)
        self.prediction.setObjectName("modelPrediction")
        self.error = QLabel(wordWrap=True)
        self.error.setObjectName("errorText")
        self._config: ModelConfig | None = None
        self._header: WeightsHeader | None = None  # weight shapes and stored kinds
        self.found = FoundModelsList(lambda: model_discovery.discover(paths.data_dir()))
        self.get_model = QPushButton("Get a model…")
        self.get_model.setObjectName("getModelButton")
        self.get_model.setToolTip("Search the Hugging Face Hub for models that fit this machine")

        row = QHBoxLayout()
        row.addWidget(self.path, 1)
        row.addWidget(self.browse)
        row.addWidget(self.get_model)  # on the path's row: the column has no height to spare
        form = QFormLayout()
        form.addRow("Source", self.source)
        form.addRow("Path", row)
        # The header and the planner's lines scroll rather than being cut mid-sentence where
        # the found list leaves them less height than they need (a 700 px screen).
        details = QWidget()
        details_layout = QVBoxLayout(details)
        details_layout.setContentsMargins(0, 0, 0, 0)
        details_layout.addWidget(self.info)
        details_layout.addWidget(self.prediction)
        details_layout.addWidget(self.error)
        details_layout.addStretch(1)
        self.details = QScrollArea(widgetResizable=True)
        self.details.setObjectName("modelDetails")
        self.details.setFrameShape(QFrame.Shape.NoFrame)
        self.details.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.details.setWidget(details)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.found)
        layout.addWidget(self.details, 1)

        if model:
            gguf = str(model).lower().endswith(".gguf") or is_gguf_file(model)  # Ollama's blobs
            self.source.setCurrentIndex(1 if gguf else 2)
            self.path.setText(str(model))
        self.source.currentIndexChanged.connect(self._source_changed)
        self.path.editingFinished.connect(self._reload)
        self.browse.clicked.connect(self._browse)
        self.found.model_chosen.connect(self.choose_gguf)
        self.get_model.clicked.connect(self._get_model)
        self._source_changed()

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        # A hint, not setMinimumWidth: the found list widens its least width once it knows its
        # columns, and a fixed minimum below that clipped its last column.
        hint = super().minimumSizeHint()
        return QSize(max(MIN_WIDTH, hint.width()), hint.height())

    def model_path(self) -> str | None:
        if self.source.currentIndex() == 0:
            return None
        return self.path.text().strip() or None

    def model_config(self) -> ModelConfig | None:
        return self._config

    def weights_header(self) -> WeightsHeader | None:
        """The chosen model's weight shapes and stored kinds (None: unread or config only)."""
        return self._header

    def choose_gguf(self, path: str) -> None:
        """Pick a GGUF file (a row of the found list): show its header and prediction."""
        self.path.setText(path)
        if self.source.currentIndex() == 1:
            self._reload()
        else:
            self.source.setCurrentIndex(1)  # reloads

    def get_model_action(self) -> QAction | None:
        """Engine ▸ Get a model… of the window this picker's dialog belongs to, if any."""
        owner = self.window().parentWidget()
        return owner.findChild(QAction, GET_MODEL_ACTION) if owner is not None else None

    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        self.get_model.setEnabled(self.get_model_action() is not None)

    def _get_model(self) -> None:
        action = self.get_model_action()
        if action is None:
            return
        dialog = self.window()
        if isinstance(dialog, QDialog):
            dialog.reject()
        action.trigger()

    def _source_changed(self) -> None:
        custom = self.source.currentIndex() != 0
        self.path.setEnabled(custom)
        self.browse.setEnabled(custom)
        self._reload()

    def _browse(self) -> None:
        if self.source.currentIndex() == 1:
            path, _ = QFileDialog.getOpenFileName(self, "GGUF model", "", GGUF_FILTERS)
        else:
            path = QFileDialog.getExistingDirectory(self, "HF model folder")
        if path:
            self.path.setText(path)
            self._reload()

    def _reload(self) -> None:
        self._config = None
        self._header = None
        self.error.setText("")
        if self.source.currentIndex() != 0 and not self.model_path():
            self.info.setText("Choose a file or folder.")
        else:
            try:
                # Cached per file version: a reopen or a switch back reads nothing.
                self._config, self._header = read_headers(self.model_path())
            except Exception as e:  # any unreadable file: say why, keep the dialog usable
                self.info.setText("")
                self.error.setText(f"Cannot read this model: {type(e).__name__}: {e}")
        if self._config is not None:
            mc = self._config
            title = name_of_blob(self.model_path() or "") or mc.name or "model"
            self.info.setText(
                f"<b>{html.escape(elide_middle(title, TITLE_CHARS))}</b><br>"
                f"Architecture: {mc.architecture}, {format_count(count_parameters(mc))} parameters"
                f"<br>{mc.num_layers} layers, {mc.num_heads} query / {mc.num_kv_heads} KV heads, "
                f"head dim {mc.head_dim}<br>Context length: {mc.max_position_embeddings:,} tokens"
            )
        self.model_changed.emit()

    def show_prediction(self, engine_settings) -> None:
        """What the planner predicts for these settings: KV bytes per token, blocks, tokens."""
        mc = self._config
        if mc is None:
            self.prediction.setText("")
            return
        try:
            config = resolve_for_weights(engine_settings.engine_config(), self._header)
            kv_dtype = planner.dtype_name(config.kv_torch_dtype)
            per_token = planner.bytes_per_token(
                mc.num_layers, mc.num_kv_heads, mc.head_dim, kv_dtype
            )
            lines = self._weight_lines(config)
            context = min(
                engine_settings.max_model_len or mc.max_position_embeddings,
                mc.max_position_embeddings,
            )
            on_cpu = config.torch_device.type == "cpu"
            if on_cpu:
                budget = f"{engine_settings.kv_budget_mib} MiB"
                blocks = planner.predict_num_blocks(
                    mc, config.block_size, kv_dtype, engine_settings.kv_budget_mib << 20
                )
            else:
                plan = planner.plan_kv(
                    mc,
                    context=context,
                    dtype=kv_dtype,
                    block_size=config.block_size,
                    vram_bytes=_cuda_total_bytes(config.torch_device),
                    gpu_memory_utilization=engine_settings.gpu_memory_utilization,
                )
                # Given vram_bytes, a plan always has a budget and a block count.
                assert plan.kv_budget_bytes is not None and plan.num_blocks is not None
                budget = f"About {plan.kv_budget_bytes / 2**30:.2f} GiB left on the GPU"
                blocks = plan.num_blocks
            # Sliding-window layers hold only their window: the sentence adds up per KV group.
            figures = pool_figures(mc, config.block_size, kv_dtype, blocks, context)
            lines.append(
                f"KV cache: {planner.format_bytes(per_token)} per token ({kv_dtype}); "
                f"{block_sentence(figures)}"
            )
            upper = "" if on_cpu else " (an upper bound: activations are measured at load)"
            lines.append(f"Planner: {pool_sentence(figures, budget)}{upper}")
            lines.append(prediction_line(blocks, config.block_size, context, figures.num_groups))
            self.prediction.setText("<br>".join(lines))
        except (ValueError, RuntimeError) as e:
            self.prediction.setText(f"Planner: {e}")

    def _weight_lines(self, config) -> list[str]:
        """Weights as the engine will keep them, and whether they fit what is free."""
        if self._header is None or self._config is None:
            return []
        fit = weight_fit(config, self._header, self._config.tie_word_embeddings)
        wp = fit.plan
        dtype = str(config.torch_dtype).removeprefix("torch.")
        line = (
            f"Weights: {'+'.join(wp.formats)} kept as {wp.layout}, "
            f"{wp.runtime_bytes / 2**30:.2f} GiB (+{wp.load_peak_bytes / 2**30:.2f} GiB while "
            f"loading), compute in {dtype}"
        )
        if fit.free_bytes is not None:
            where = "GPU" if config.torch_device.type == "cuda" else "RAM"
            line += f"; {fit.free_bytes / 2**30:.1f} GiB {where} free"
            if not fit.fits:
                line += " — <b>does not fit</b>"
        # float32 over quantized weights: dequantized once, or (when that does not fit) on
        # every call, which is ~3x slower; say which.
        return [line, f"Weights: {fit.note}"] if fit.note else [line]


def _cuda_total_bytes(device) -> int:
    import torch

    return torch.cuda.get_device_properties(device).total_memory
