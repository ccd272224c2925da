"""EngineStatusBar: what the engine is doing, how full the pool is, and which model runs.

The window feeds it engine events; it only formats them. Its pool label has a fixed width
because it changes ten times a second and must not relayout the window each time.
"""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QWidget

from app.engine_messages import EngineInfo
from app.model_picker import format_count

POOL_LABEL_SAMPLE = "KV 000000/000000 blocks used, 000000 cached · 0000 running"


class EngineStatusBar(QStatusBar):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state_label = QLabel("Starting…", objectName="engineState")
        self.pool_label = QLabel(objectName="poolLabel")
        sample_width = self.pool_label.fontMetrics().horizontalAdvance(POOL_LABEL_SAMPLE)
        self.pool_label.setFixedWidth(sample_width + 16)
        self.model_label = QLabel(objectName="modelLabel")
        self.busy_bar = QProgressBar(objectName="busyBar", maximumWidth=140, textVisible=False)
        self.busy_bar.setRange(0, 0)
        self.busy_bar.setVisible(False)
        self.addWidget(self.state_label)
        self.addPermanentWidget(self.pool_label)
        self.addPermanentWidget(self.model_label)
        self.addPermanentWidget(self.busy_bar)

    def show_engine(self, info: EngineInfo) -> None:
        self.model_label.setText(
            f"{info.model_name} · {info.architecture} {format_count(info.num_parameters)} · "
            f"{info.device} {info.dtype} · weights {info.weight_format} "
            f"{info.weight_bytes / 2**20:,.0f} MiB · KV {info.kv_dtype} "
            f"{info.kv_bytes_per_token / 1024:.0f} KiB/token · "
            f"{info.num_blocks:,} blocks × {info.block_size}"
        )
        self.model_label.setToolTip(
            f"{info.model_source}\nmax_model_len {info.max_model_len:,}\n"
            f"weights: {info.weight_format}, {info.weight_bytes:,} bytes, "
            f"run as {info.weight_layout}"
        )

    def show_busy(self, text: str) -> None:
        """What the worker is doing ("" when it is done); while busy, the state line says it."""
        self.busy_bar.setVisible(bool(text))
        if text:
            self.state_label.setText(text)

    def show_state(self, engine_loaded: bool, replies_in_flight: int) -> None:
        if self.busy_bar.isVisible():
            return
        if not engine_loaded:
            self.state_label.setText("No model loaded")
        elif replies_in_flight:
            n = replies_in_flight
            self.state_label.setText(f"Generating {n} repl{'y' if n == 1 else 'ies'}")
        else:
            self.state_label.setText("Ready")

    def show_pool(self, stats: dict) -> None:
        self.pool_label.setText(
            f"KV {stats['kv_blocks_used']}/{stats['kv_blocks_total']} blocks used, "
            f"{stats['kv_blocks_cached']} cached · {stats['num_running']} running"
        )
