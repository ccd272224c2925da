"""Timeline: one time axis for both runs, a slider over it and Play/Pause.

The slider has a fixed number of positions over the longer run's duration (a 100 ms test trace
and an hour of chat scrub alike); Play moves the time on at a chosen multiple of real time and
pauses at the end.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QSlider, QWidget

POSITIONS = 10_000
TICK_MS = 50
SPEEDS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 50.0)  # seconds of the runs per second
DEFAULT_SPEED = 1.0
PLAY_TEXT, PAUSE_TEXT = "▶ Play", "❚❚ Pause"


class Timeline(QWidget):
    time_changed = Signal(float)  # seconds from the trace's start

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.duration = 0.0
        self._time = 0.0
        self.play = QPushButton(PLAY_TEXT)
        self.play.setObjectName("whatifPlay")
        self.play.setToolTip("Move both runs on together; click again to pause")
        self.speed = QComboBox()
        self.speed.setObjectName("whatifSpeed")
        for rate in SPEEDS:
            self.speed.addItem(f"{rate:g}× real time", rate)
        self.speed.setCurrentIndex(SPEEDS.index(DEFAULT_SPEED))
        self.speed.setToolTip("Playback speed")
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setObjectName("whatifTime")
        self.slider.setRange(0, POSITIONS)
        self.label = QLabel("t = 0.00 s")
        self.label.setObjectName("whatifTimeLabel")
        self.label.setMinimumWidth(self.label.fontMetrics().horizontalAdvance("t = 0,000.00 s"))
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.play)
        row.addWidget(self.speed)
        row.addWidget(self.slider, 1)
        row.addWidget(self.label)
        self._timer = QTimer(self, interval=TICK_MS)
        self._timer.timeout.connect(self._tick)
        self.play.clicked.connect(self.toggle_play)
        self.slider.valueChanged.connect(self._moved)

    @property
    def time(self) -> float:
        return self._time

    @property
    def playing(self) -> bool:
        return self._timer.isActive()

    def set_duration(self, seconds: float) -> None:
        """The longer run's end; the time shown stays where it was, within it."""
        self.duration = max(seconds, 0.0)
        self.set_time(min(self._time, self.duration))

    def set_time(self, seconds: float) -> None:
        """Show time `seconds` (kept exactly; the slider takes the nearest position)."""
        self._time = min(max(seconds, 0.0), self.duration)
        position = round(POSITIONS * self._time / self.duration) if self.duration > 0 else 0
        self.slider.blockSignals(True)
        self.slider.setValue(position)
        self.slider.blockSignals(False)
        self._announce()

    def toggle_play(self) -> None:
        if self.playing:
            self.pause()
            return
        if self._time >= self.duration:
            self.set_time(0.0)  # at the end: play from the start
        self._timer.start()
        self.play.setText(PAUSE_TEXT)

    def pause(self) -> None:
        self._timer.stop()
        self.play.setText(PLAY_TEXT)

    def _tick(self) -> None:
        if self._time >= self.duration:
            self.pause()
            return
        self.set_time(self._time + self.speed.currentData() * TICK_MS / 1000)

    def _moved(self, position: int) -> None:  # the user dragged the slider
        # The end is the duration itself: d * 10000 / 10000 can come out an ulp short of the
        # last step's end, and the map then stopped one step before the run's last.
        self._time = (
            self.duration if position >= POSITIONS else self.duration * position / POSITIONS
        )
        self._announce()

    def _announce(self) -> None:
        self.label.setText(f"t = {self._time:,.2f} s")
        self.time_changed.emit(self._time)
