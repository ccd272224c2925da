"""SamplingPanel: temperature, top-p, top-k, max tokens, seed and n for the next reply."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QDoubleSpinBox, QGridLayout, QLabel, QSpinBox, QWidget

from app.settings import SamplingSettings

SEED_MAX = 2**31 - 1  # what a QSpinBox holds; the engine accepts more


class SamplingPanel(QWidget):
    changed = Signal(object)  # SamplingSettings

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("samplingPanel")
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=2.0, singleStep=0.1, decimals=2)
        self.temperature.setToolTip("0 = greedy")
        self.top_p = QDoubleSpinBox(minimum=0.01, maximum=1.0, singleStep=0.05, decimals=2)
        self.top_k = QSpinBox(minimum=0, maximum=100_000)
        self.top_k.setSpecialValueText("off")
        self.max_tokens = QSpinBox(minimum=1, maximum=1 << 20)
        self.seed = QSpinBox(minimum=-1, maximum=SEED_MAX)
        self.seed.setSpecialValueText("random")
        self.n = QSpinBox(minimum=1, maximum=16)
        self.n.setToolTip("samples per reply: they share the prompt's KV blocks")
        grid = QGridLayout(self)
        grid.setContentsMargins(4, 4, 4, 4)
        cells = [
            ("Temperature", self.temperature),
            ("Top-p", self.top_p),
            ("Top-k", self.top_k),
            ("Max tokens", self.max_tokens),
            ("Seed", self.seed),
            ("Samples (n)", self.n),
        ]
        for i, (label, widget) in enumerate(cells):  # two pairs a row: fits a narrow column
            grid.addWidget(QLabel(label), i // 2, (i % 2) * 2)
            grid.addWidget(widget, i // 2, (i % 2) * 2 + 1)
        self.set_settings(SamplingSettings())
        for spin in (self.temperature, self.top_p, self.top_k, self.max_tokens, self.seed, self.n):
            spin.valueChanged.connect(lambda _v: self.changed.emit(self.settings()))

    def set_settings(self, s: SamplingSettings) -> None:
        widgets = (self.temperature, self.top_p, self.top_k, self.max_tokens, self.seed, self.n)
        for w in widgets:
            w.blockSignals(True)
        self.temperature.setValue(s.temperature)
        self.top_p.setValue(s.top_p)
        self.top_k.setValue(max(s.top_k, 0))
        self.max_tokens.setValue(s.max_tokens)
        self.seed.setValue(s.seed if s.seed is not None and 0 <= s.seed <= SEED_MAX else -1)
        self.n.setValue(s.n)
        for w in widgets:
            w.blockSignals(False)

    def settings(self) -> SamplingSettings:
        return SamplingSettings(
            temperature=round(self.temperature.value(), 2),
            top_p=round(self.top_p.value(), 2),
            top_k=self.top_k.value() if self.top_k.value() > 0 else -1,
            max_tokens=self.max_tokens.value(),
            seed=self.seed.value() if self.seed.value() >= 0 else None,
            n=self.n.value(),
        )
