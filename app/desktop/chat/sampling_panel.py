"""SamplingPanel: the chat's own sampling settings, and a button to make them the default.

Each chat keeps its own temperature, top-p, top-k, min-p, repetition penalty, max tokens, seed
and n (the ChatController stores them with the chat); "Use for new chats" makes them the
defaults that new chats start from. Below them, the chat's structured output (a JSON Schema its
replies follow: structured_output_field.py), which stays the chat's own.

The chat shows the panel in a SamplingScroll: two pairs a row, each label beside its knob where
the column is wide enough and above it where it is not, and what does not fit the height
scrolls, so the open panel never makes the chat column (or the window) wider or taller.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QFrame,
    QGridLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QWidget,
)

from kvscope.app.core.settings import SamplingSettings
from kvscope.app.desktop.chat.structured_output_field import StructuredOutputField

SEED_MAX = 2**31 - 1  # what a QSpinBox holds; the engine accepts more
MIN_VISIBLE_HEIGHT = 100  # a short window squeezes the open panel to this, then it scrolls


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
        self.make_default = QPushButton("Use for new chats")
        self.make_default.setObjectName("samplingDefault")
        self.make_default.setToolTip("New chats start from these settings")
        cells: list[tuple[str, QSpinBox | QDoubleSpinBox]] = [
            ("Temperature", self.temperature),
            ("Top-p", self.top_p),
            ("Top-k", self.top_k),
            ("Min-p", self.min_p),
            ("Repeat penalty", self.repetition_penalty),
            ("Max tokens", self.max_tokens),
            ("Seed", self.seed),
            ("Samples (n)", self.n),
        ]
        self._spins = [widget for _, widget in cells]
        self._pairs = [(QLabel(label), widget) for label, widget in cells]
        self.structured = StructuredOutputField()
        self._grid = QGridLayout(self)
        self._grid.setContentsMargins(4, 4, 4, 4)
        self.stacked: bool | None = None  # labels above their spin boxes, once arranged
        self.arrange(stacked=False)
        self.set_settings(SamplingSettings())
        for spin in self._spins:
            spin.valueChanged.connect(lambda _v: self.changed.emit(self.settings()))
        self.make_default.clicked.connect(lambda: self.defaults_requested.emit(self.settings()))

    def arrange(self, stacked: bool) -> None:
        """Two pairs a row, each label beside its spin box, or (`stacked`, for a narrow column)
        above it; the structured output spans the rows' width below."""
        if stacked == self.stacked:
            return
        self.stacked = stacked
        widgets = [w for pair in self._pairs for w in pair] + [self.make_default, self.structured]
        for widget in widgets:
            self._grid.removeWidget(widget)
        for i, (label, spin) in enumerate(self._pairs):
            row, column = divmod(i, 2)
            if stacked:
                self._grid.addWidget(label, 2 * row, column)
                self._grid.addWidget(spin, 2 * row + 1, column)
            else:
                self._grid.addWidget(label, row, 2 * column)
                self._grid.addWidget(spin, row, 2 * column + 1)
        rows = -(-len(self._pairs) // 2) * (2 if stacked else 1)
        if stacked:
            self._grid.addWidget(self.make_default, rows, 1)
        else:  # beside an odd last pair, or under the last pair on the right
            self._grid.addWidget(self.make_default, len(self._pairs) // 2, 2, 1, 2)
        self._grid.addWidget(self.structured, rows + 1, 0, 1, 2 if stacked else 4)
        for column in range(4):  # the spin boxes take the width; unused columns none
            wide = column < 2 if stacked else column % 2 == 1
            self._grid.setColumnStretch(column, 1 if wide else 0)

    def width_for(self, stacked: bool) -> int:
        """The width the knobs need laid out so (labels and spin boxes at their widest, so
        every pair fits whichever column it lands in)."""
        label = max(label.sizeHint().width() for label, _ in self._pairs)
        spin = max(spin.minimumSizeHint().width() for _, spin in self._pairs)
        margins = self._grid.contentsMargins()
        left, right = margins.left(), margins.right()
        gap = max(self._grid.horizontalSpacing(), 0)
        if stacked:
            return left + right + 2 * max(label, spin) + gap
        return left + right + 2 * (label + spin) + 3 * gap

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


class SamplingScroll(QScrollArea):
    """The panel as the chat shows it: as tall as it needs up to the height the chat gives it
    (`setMaximumHeight`), then scrolling; each label beside its knob where they fit, else above
    it. Checking structured output, or a problem with its schema, scrolls it into view."""

    def __init__(self, panel: SamplingPanel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("samplingScroll")
        self.panel = panel
        self.setWidget(panel)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        panel.structured.shown_changed.connect(self._structured_shown)
        panel.structured.problem_changed.connect(self._structured_shown)

    def show_structured(self) -> None:
        """Scroll the structured output, its editor and error included, into view (after the
        layout has made room for an editor just shown)."""
        QTimer.singleShot(0, self._scroll_to_structured)

    def _scroll_to_structured(self) -> None:
        # Not ensureWidgetVisible: for a text editor it shows only the line of its cursor.
        field = self.panel.structured
        last = field.error if field.error.isVisible() else field.editor
        top = field.mapTo(self.panel, QPoint(0, 0)).y()
        bottom = last.mapTo(self.panel, QPoint(0, last.height())).y()
        bar = self.verticalScrollBar()
        # Its bottom in view, and its top where it is taller than the view.
        bar.setValue(min(max(bar.value(), bottom - self.viewport().height()), top))

    def _structured_shown(self, shown: object) -> None:
        """Checked, or a problem to read under the editor: scroll down to it."""
        if shown and self.isVisible():
            self.show_structured()

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        # The panel's own height: QScrollArea's hint stops at 24 lines of text.
        hint = self.panel.sizeHint()
        return QSize(hint.width(), hint.height() + 2 * self.frameWidth())

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        height = min(self.panel.sizeHint().height(), MIN_VISIBLE_HEIGHT)
        return QSize(self.panel.width_for(stacked=True), height)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        # The vertical bar's width is left aside before it shows, so that a panel that starts
        # to scroll does not flip between labels beside and above their knobs.
        room = self.width() - 2 * self.frameWidth() - self.verticalScrollBar().sizeHint().width()
        stacked = room < self.panel.width_for(stacked=False)
        if stacked != self.panel.stacked:
            self.panel.arrange(stacked)
            self.updateGeometry()  # its height hint changed
