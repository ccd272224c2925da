"""SamplingPanel: the chat's own sampling settings, and a button to make them the default.

Each chat keeps its own temperature, top-p, top-k, min-p, repetition penalty, max tokens, seed
and n (the ChatController stores them with the chat); "Use for new chats" makes them the
defaults that new chats start from.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QDoubleSpinBox,
    QGridLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QWidget,
)

from kvscope.app.core.settings import SamplingSettings

SEED_MAX = 2**31 - 1  # what a QSpinBox holds; the engine accepts more


class SamplingPanel(QWidget):
    changed = Signal(object)  # SamplingSettings: the user changed one of them
    defaults_requested = Signal(object)  # SamplingSettings to start new chats from

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("samplingPanel")
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=2.0, singleStep=0.1, decimals=2)
        self.temperature.setToolTip("0 = greedy")
        self.top_p = QDoubleSpinBox(minimum=0.01, maximum=1.0, singleStep=0.05, decimals=2)
        self.top_k = QSpinBox(minimum=0, maximum=100_000)
        self.top_k.setSpecialValueText("off")
        self.min_p = QDoubleSpinBox(minimum=0.0, maximum=1.0, singleStep=0.01, decimals=2)
        self.min_p.setSpecialValueText("off")
        self.min_p.setToolTip("drop tokens less likely than this share of the likeliest one")
        self.repetition_penalty = QDoubleSpinBox(
            minimum=0.5, maximum=2.0, singleStep=0.05, decimals=2
        )
        self.repetition_penalty.setToolTip(
            "1 = off; above 1 makes tokens already in the chat less likely"
        )
        self.max_tokens = QSpinBox(minimum=1, maximum=1 << 20)
        self.seed = QSpinBox(minimum=-1, maximum=SEED_MAX)
        self.seed.setSpecialValueText("random")
        self.n = QSpinBox(minimum=1, maximum=16)
        self.n.setToolTip("samples per reply: they share the prompt's KV blocks")
        self.make_default = QPushButton("Use for new chats", objectName="samplingDefault")
        self.make_default.setToolTip("New chats start from these settings")
        cells = [
            ("Temperature", self.temperature),
            ("Top-p", self.top_p),
            ("Top-k", self.top_k),
            ("Min-p", self.min_p),
            ("Repeat penalty", self.repetition_penalty),
            ("Max tokens", self.max_tokens),
            ("Seed", self.seed),
            ("Samples (n)", self.n),
        ]
        self._spins: list[QAbstractSpinBox] = [widget for _, widget in cells]
        grid = QGridLayout(self)
        grid.setContentsMargins(4, 4, 4, 4)
        for i, (label, widget) in enumerate(cells):  # two pairs a row: fits a narrow column
            grid.addWidget(QLabel(label), i // 2, (i % 2) * 2)
            grid.addWidget(widget, i // 2, (i % 2) * 2 + 1)
        grid.addWidget(self.make_default, len(cells) // 2, 2, 1, 2)
        self.set_settings(SamplingSettings())
        for spin in self._spins:
            spin.valueChanged.connect(lambda _v: self.changed.emit(self.settings()))
        self.make_default.clicked.connect(lambda: self.defaults_requested.emit(self.settings()))

    def set_settings(self, s: SamplingSettings) -> None:
        """Show `s` without reporting it as a change."""
        for w in self._spins:
            w.blockSignals(True)
        self.temperature.setValue(s.temperature)
        self.top_p.setValue(s.top_p)
        self.top_k.setValue(max(s.top_k, 0))
        self.min_p.setValue(s.min_p)
        self.repetition_penalty.setValue(s.repetition_penalty)
        self.max_tokens.setValue(s.max_tokens)
        self.seed.setValue(s.seed if s.seed is not None and 0 <= s.seed <= SEED_MAX else -1)
        self.n.setValue(s.n)
        for w in self._spins:
            w.blockSignals(False)

    def settings(self) -> SamplingSettings:
        return SamplingSettings(
            temperature=round(self.temperature.value(), 2),
            top_p=round(self.top_p.value(), 2),
            top_k=self.top_k.value() if self.top_k.value() > 0 else -1,
            max_tokens=self.max_tokens.value(),
            seed=self.seed.value() if self.seed.value() >= 0 else None,
            n=self.n.value(),
            min_p=round(self.min_p.value(), 2),
            repetition_penalty=round(self.repetition_penalty.value(), 2),
        )
