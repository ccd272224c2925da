"""EngineStatusBar: what the engine is doing, how full the pool is, and which model runs.

The window feeds it engine events; it only formats them. Its pool label has a fixed width
because it changes ten times a second and must not relayout the window each time. The state
line counts the engine's own sequences too, so simulated users are never shown as "Ready"; a
warning label says when the naive allocator cannot hold two sequences
(app/desktop/blockmap/pool_fit.py).
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QWidget

from kvscope.app.core.engine_messages import EngineInfo
from kvscope.app.desktop.blockmap.pool_fit import naive_sequences, naive_warning
from kvscope.app.desktop.elided_label import ElidedLabel
from kvscope.app.desktop.models.picker import format_count
from kvscope.app.desktop.theme import follow_theme

POOL_LABEL_SAMPLE = "KV 000000/000000 blocks held, 000000 cached · 0000 running"
QWIDGETSIZE_MAX = (1 << 24) - 1  # Qt's "no maximum"
KERNEL_SHARE = 0.5  # of the bar's width, at most, for the CPU kernels' line


PROGRESS_STEPS = 1000  # the bar's range when a stage says how far it is


class EngineStatusBar(QStatusBar):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state_label = QLabel("Starting…")
        self.state_label.setObjectName("engineState")
        self.pool_label = QLabel()
        self.pool_label.setObjectName("poolLabel")
        sample_width = self.pool_label.fontMetrics().horizontalAdvance(POOL_LABEL_SAMPLE)
        self.pool_label.setFixedWidth(sample_width + 16)
        # Elided: the long model line must not set the window's minimum width.
        self.model_label = ElidedLabel(objectName="modelLabel")
        self.busy_bar = QProgressBar(textVisible=False)
        self.busy_bar.setObjectName("busyBar")
        self.busy_bar.setMaximumWidth(140)
        self.busy_bar.setRange(0, 0)
        self.busy_bar.setVisible(False)
        # Elided too: shown whole it took 265 px, and the bar with it outgrew a 1024-px screen.
        self.warning_label = ElidedLabel(objectName="poolWarning")
        # The banner's text colour: the dark theme's amber is unreadable on the light bar.
        follow_theme(
            self.warning_label,
            lambda p: self.warning_label.setStyleSheet(f"color: {p.banner[1]}; font-weight: bold;"),
        )
        self.warning_label.setVisible(False)
        # The CPU kernels' background compile and the switch to them
        # (app/desktop/engine_thread/kernel_switch.py)
        self.kernel_label = ElidedLabel(objectName="kernelState")
        self.kernel_label.setVisible(False)
        # No minimum of its own (not even ElidedLabel's 12 characters): it never widens the bar.
        self.kernel_label.setMinimumWidth(1)
        self._kernel_line = ""
        self._busy_text = ""
        self._engine_loaded = False
        self._replies = 0
        self._sequences = (0, 0)  # the engine's running, waiting (chats and simulated users)
        self.addWidget(self.state_label)
        self.addWidget(self.kernel_label, 1)
        self.addPermanentWidget(self.warning_label)
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
        warning = naive_warning(info.num_blocks, info.block_size, info.max_model_len)
        fits = naive_sequences(info.num_blocks, info.block_size, info.max_model_len)
        self.warning_label.setText(f"⚠ naive allocator fits {fits} sequence{'s' * (fits != 1)}")
        self.warning_label.setVisible(bool(warning))
        self.warning_label.setToolTip(warning)

    def show_busy(self, text: str) -> None:
        """What the worker is doing ("" when it is done); while busy, the state line says it.
        The bar is indeterminate until a stage reports how far it is (show_progress)."""
        if text and text != self._busy_text:  # a new stage: how far it is, unknown yet
            self.busy_bar.setRange(0, 0)
        self._busy_text = text
        self.busy_bar.setVisible(bool(text))
        if text:
            self._set_state(text)

    def show_progress(self, share: float) -> None:
        """How far the stage on show is, 0 to 1: the bar fills (loading the weights)."""
        self.busy_bar.setRange(0, PROGRESS_STEPS)
        self.busy_bar.setValue(round(min(max(share, 0.0), 1.0) * PROGRESS_STEPS))

    def _set_state(self, text: str) -> None:
        """The state line; the kernels' line refitted before the bar lays out the new width."""
        self.state_label.setText(text)
        if self._kernel_line:
            self._fit_kernels()

    def show_kernels(self, line: str) -> None:
        """The CPU kernels' compile or switch ("" hides it); the full line in the tooltip."""
        self._kernel_line = line
        self.kernel_label.setToolTip(line)
        self.kernel_label.setVisible(bool(line))
        self._fit_kernels()  # with "", gives the model line its width back

    def event(self, e: QEvent) -> bool:
        # A badge shown, a resize: the kernels' line is fitted again to the room left.
        if e.type() in (QEvent.Type.LayoutRequest, QEvent.Type.Resize) and self._kernel_line:
            self._fit_kernels()
        return super().event(e)

    def _fit_kernels(self) -> None:
        """Room for the kernels' line by holding the model line back (its maximum width), not
        by a minimum of its own: a minimum would widen the window past a small screen and stop
        it being made narrower. Where the whole line does not fit, its first clause does ("CPU
        kernels compiling, about 26 s left"); the rest elides."""
        label, line, model = self.kernel_label, self._kernel_line, self.model_label
        if not line:
            model.setMaximumWidth(QWIDGETSIZE_MAX)
            return
        free = self.width() - self._others_width()
        margins = label.contentsMargins()  # the stylesheet's padding
        pad = margins.left() + margins.right() + 4

        def width(text: str) -> int:
            return label.fontMetrics().horizontalAdvance(text) + pad

        model_min = model.minimumSizeHint().width()
        shown = line
        if width(line) > min(free - model_min, int(self.width() * KERNEL_SHARE)):
            shown = line.split(";")[0].replace(" in the background", "")
        if label.text() != shown:
            label.setText(shown)
        cap = max(model_min, free - width(shown))
        if model.maximumWidth() != cap:
            model.setMaximumWidth(cap)

    def _others_width(self) -> int:
        """What the bar's visible widgets but these two take at their preferred widths."""
        mine = (self.kernel_label, self.model_label)
        others = [
            w
            for w in self.findChildren(QWidget, options=Qt.FindChildOption.FindDirectChildrenOnly)
            if w not in mine and w.isVisible()
        ]
        wanted = sum(max(w.minimumWidth(), w.sizeHint().width()) for w in others)
        return wanted + 8 * (len(others) + 4)

    def show_state(self, engine_loaded: bool, replies_in_flight: int) -> None:
        self._engine_loaded, self._replies = engine_loaded, replies_in_flight
        self._show_state()

    def _show_state(self) -> None:
        if self.busy_bar.isVisible():
            return
        running, waiting = self._sequences
        engine = f"{running} running, {waiting} waiting"
        if not self._engine_loaded:
            self._set_state("No model loaded")
        elif self._replies:
            n = self._replies
            self._set_state(f"Generating {n} repl{'y' if n == 1 else 'ies'} · {engine}")
        elif running or waiting:  # simulated users (or replies just ending): not idle
            self._set_state(f"Serving requests · {engine}")
        else:
            self._set_state("Ready")

    def show_pool(self, stats: dict) -> None:
        """Pool occupancy from llm.stats(): a contiguous engine's reservations count as held,
        as they do in the block map's tiles."""
        self.pool_label.setText(
            f"KV {stats['kv_blocks_used']}/{stats['kv_blocks_total']} blocks held, "
            f"{stats['kv_blocks_cached']} cached · {stats['num_running']} running"
        )
        sequences = (int(stats.get("num_running", 0)), int(stats.get("num_waiting", 0)))
        if sequences != self._sequences:
            self._sequences = sequences
            self._show_state()
