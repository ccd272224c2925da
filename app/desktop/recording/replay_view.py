"""ReplayDialog: a recorded session, scrubbed step by step on the block maps.

A recording (app/desktop/recording/controls.py, or `kvscope record`) is the natural way to study
what the allocator did: drag the timeline and both maps show the pool and the naive contiguous
shadow as they were after that step. `replay_events` turns the file back into those snapshots;
it runs on a background thread (it reads the whole file and rebuilds every step), and the
slider grows as steps arrive, so a long session never freezes the window. A file is data from
anywhere: one too big to view is refused before it is read, the steps kept are capped by count
and memory, and a damaged or hostile file ends in a message, never a crash. Play steps through
on a timer at the chosen speed (steps a second) and pauses at the last step read, or on a click.
It wears the block map panel's sheet in the theme on show and follows a switch (`follow_theme`).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QSlider,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.desktop.blockmap.block_map import BlockMapView
from kvscope.app.desktop.blockmap.legend import StateKey
from kvscope.app.desktop.blockmap.panel import (
    caption_style,
    paged_caption,
    panel_style,
    shadow_caption,
)
from kvscope.app.desktop.palette import Palette, current
from kvscope.app.desktop.theme import follow_theme
from kvscope.engine.input_file import check_input_file, open_input_file
from kvscope.engine.kv.replay import replay_events
from kvscope.engine.kv.snapshot import KVSnapshot

MAX_FILE_BYTES = 256 << 20  # the reader holds the whole file as text
MAX_VIEW_BLOCKS = 1 << 22  # a few GPU pools' worth; beyond it one snapshot is too big to keep
MAX_STEPS = 20_000
MAX_KEPT_BYTES = 1 << 30  # all kept snapshots together
HEADER_LIMIT = 16 << 20  # the first line (it lists cached blocks), read before the rest
POLL_MS = 100
PLAY_SPEEDS = (1, 2, 5, 10, 25)  # steps a second
DEFAULT_SPEED = 5
PLAY_TEXT, PAUSE_TEXT = "▶ Play", "❚❚ Pause"


def check_recording(path: Path) -> dict:
    """The recording's header; refuses what the viewer cannot hold, before anything sizes
    arrays from it (the reader checks the rest)."""
    size = check_input_file(path, "recording")  # a folder, a device, a pipe: said as such
    if size > MAX_FILE_BYTES:
        raise ValueError(
            f"{path} is {size / 2**20:,.0f} MiB; the viewer opens recordings up to "
            f"{MAX_FILE_BYTES >> 20} MiB (`kvscope replay` reads any size)"
        )
    with open_input_file(path, "recording") as f:
        first = f.readline(HEADER_LIMIT)
    try:
        header = json.loads(first)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply to parse
        raise ValueError(
            f"{path} is not a KVScope recording (its first line is no header)"
        ) from None
    blocks = header.get("num_blocks") if isinstance(header, dict) else None
    if isinstance(blocks, int) and blocks > MAX_VIEW_BLOCKS:
        raise ValueError(
            f"{path} records a pool of {blocks:,} blocks; the viewer shows up to "
            f"{MAX_VIEW_BLOCKS:,}"
        )
    return header if isinstance(header, dict) else {}


def snapshot_bytes(snapshot: KVSnapshot | None) -> int:
    if snapshot is None:
        return 0
    arrays = (snapshot.state, snapshot.owner, snapshot.num_owners, snapshot.ref_count)
    rest = (snapshot.filled, snapshot.logical_index, snapshot.has_hash)
    tables = sum(len(s.block_table) for s in snapshot.sequences) * 8
    return sum(a.nbytes for a in arrays + rest) + tables


class ReplayLoader:
    """Reads a recording into (pool, shadow) steps on a thread; the GUI polls `steps`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.steps: list[tuple[KVSnapshot, KVSnapshot | None]] = []
        self.error = ""
        self.cut_short = ""  # why loading stopped before the end, when a cap did
        self.done = False
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvscope-replay", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        self._cancelled.set()

    def wait(self, timeout_s: float) -> bool:
        self._thread.join(timeout_s)
        return self.done

    def _run(self) -> None:
        kept = 0
        try:
            for pool, shadow in replay_events(self.path, with_shadow=True):
                if self._cancelled.is_set():
                    break
                kept += snapshot_bytes(pool) + snapshot_bytes(shadow)
                if len(self.steps) >= MAX_STEPS or kept > MAX_KEPT_BYTES:
                    self.cut_short = (
                        f"showing the first {len(self.steps):,} steps (the viewer's cap)"
                    )
                    break
                self.steps.append((pool, shadow))
        except (OSError, ValueError) as e:  # ValueError names the file and the line
            self.error = str(e)
        except Exception as e:  # a file from anywhere: any failure is a message
            self.error = f"{self.path}: {type(e).__name__}: {e}"
        finally:
            self.done = True


class ReplayDialog(QDialog):
    """The timeline, the step's two maps and their captions. Open with `open_recording`."""

    def __init__(self, path: Path, header: dict, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Replay: {path.name}")
        self.setObjectName("blockMapPanel")
        self.resize(1100, 680)
        self.path = path
        self.loader = ReplayLoader(path)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setObjectName("replaySlider")
        self.slider.setRange(0, 0)
        self.slider.setEnabled(False)
        self.previous = QPushButton("◀ Step")
        self.next = QPushButton("Step ▶")
        self.play = QPushButton(PLAY_TEXT)
        self.play.setObjectName("replayPlay")
        self.play.setToolTip("Step through the recording on a timer; click again to pause")
        self.play.setEnabled(False)
        self.speed = QComboBox()
        self.speed.setObjectName("replaySpeed")
        for rate in PLAY_SPEEDS:
            self.speed.addItem(f"{rate} steps/s", rate)
        self.speed.setCurrentIndex(PLAY_SPEEDS.index(DEFAULT_SPEED))
        self.speed.setToolTip("Playback speed")
        self._player = QTimer(self)
        self._player.timeout.connect(self.advance)
        self.about = QLabel(_about(path, header), wordWrap=True)
        self.about.setObjectName("replayAbout")
        self.step_label = QLabel("Reading the recording…")
        self.step_label.setObjectName("replayStep")
        self.error = QLabel(wordWrap=True)
        self.error.setObjectName("errorText")
        self.error.setVisible(False)
        self.error_box: QMessageBox | None = None
        self.paged_caption, self.paged_map = _caption(), BlockMapView()
        self.shadow_caption, self.shadow_map = _caption(), BlockMapView()

        maps = QHBoxLayout()
        for caption, view in (
            (self.paged_caption, self.paged_map),
            (self.shadow_caption, self.shadow_map),
        ):
            column = QVBoxLayout()
            column.addWidget(caption)
            column.addWidget(view, 1)
            maps.addLayout(column, 1)
        timeline = QHBoxLayout()
        timeline.addWidget(self.play)
        timeline.addWidget(self.speed)
        timeline.addWidget(self.previous)
        timeline.addWidget(self.slider, 1)
        timeline.addWidget(self.next)
        layout = QVBoxLayout(self)
        layout.addWidget(self.about)
        layout.addLayout(maps, 1)
        key = QHBoxLayout()
        key.addWidget(StateKey())
        key.addStretch(1)
        layout.addLayout(key)
        layout.addLayout(timeline)
        layout.addWidget(self.step_label)
        layout.addWidget(self.error)

        self.slider.valueChanged.connect(self.show_step)
        self.previous.clicked.connect(lambda: self.slider.setValue(self.slider.value() - 1))
        self.next.clicked.connect(lambda: self.slider.setValue(self.slider.value() + 1))
        self.play.clicked.connect(self.toggle_play)
        self.speed.currentIndexChanged.connect(self._set_interval)
        self._set_interval()
        self._poll = QTimer(self, interval=POLL_MS)
        self._poll.timeout.connect(self.poll)
        self._poll.start()
        follow_theme(self, self._restyle)

    def _restyle(self, palette: Palette) -> None:
        """The panel's sheet and captions in the theme's colours; the step's captions again
        (their series colours are the theme's; the maps redraw themselves)."""
        self.setStyleSheet(panel_style(palette))
        for label in (self.about, self.step_label, self.paged_caption, self.shadow_caption):
            label.setStyleSheet(caption_style(palette))
        if self.num_steps():
            self.show_step(self.slider.value())

    def num_steps(self) -> int:
        return self.slider.maximum() + 1 if self.slider.isEnabled() else 0

    @property
    def playing(self) -> bool:
        return self._player.isActive()

    def toggle_play(self) -> None:
        if self.playing:
            self.pause()
            return
        if self.slider.value() >= self.slider.maximum():
            self.slider.setValue(0)  # at the end: play from the start
        self._player.start()
        self.play.setText(PAUSE_TEXT)

    def pause(self) -> None:
        self._player.stop()
        self.play.setText(PLAY_TEXT)

    def advance(self) -> None:
        """One step on; at the last step read it waits for more, or pauses when all are in."""
        if self.slider.value() < self.slider.maximum():
            self.slider.setValue(self.slider.value() + 1)
        elif self.loader.done:
            self.pause()

    def _set_interval(self) -> None:
        self._player.setInterval(round(1000 / self.speed.currentData()))

    def poll(self) -> None:
        """Grow the timeline by the steps read so far; report the end or the error."""
        done = self.loader.done  # read first: the steps it covers are all in by then
        count = len(self.loader.steps)
        if count > self.num_steps():
            first = self.num_steps() == 0
            self.slider.setEnabled(True)
            self.play.setEnabled(True)
            self.slider.setMaximum(count - 1)
            if first:
                self.show_step(0)
            else:
                self._label(self.slider.value())
        if not done:
            return
        self._poll.stop()
        if count:
            self._label(self.slider.value())
        else:
            self.step_label.setText("No steps to show.")
        if self.loader.error:
            shown = f"after step {count:,}" if count else "at all"
            message = f"This recording cannot be read {shown}:\n{self.loader.error}"
            self.error.setText(message)
            self.error.setVisible(True)
            self.error_box = QMessageBox(
                QMessageBox.Icon.Warning,
                "Cannot replay this recording",
                message,
                QMessageBox.StandardButton.Ok,
                self,
            )
            self.error_box.open()

    def show_step(self, index: int) -> None:
        if not 0 <= index < len(self.loader.steps):
            return
        pool, shadow = self.loader.steps[index]
        self.paged_map.set_snapshot(pool)
        self.paged_caption.setText(paged_caption(pool))
        self.shadow_map.set_snapshot(shadow)
        self.shadow_caption.setText(
            shadow_caption(shadow) if shadow is not None else "No naive shadow in this recording"
        )
        self._label(index)

    def _label(self, index: int) -> None:
        pool = self.loader.steps[index][0]
        m = pool.metrics
        total = f"{len(self.loader.steps):,}" + ("" if self.loader.done else "+ (reading…)")
        line = (
            f"Step {index + 1:,} of {total} (engine step {pool.step:,}) · {m.num_running} "
            f"running, {m.num_waiting} waiting · {m.blocks_used:,} blocks used"
        )
        if self.loader.cut_short:
            line += f" · {self.loader.cut_short}"
        self.step_label.setText(line)

    def done(self, result: int) -> None:  # closing stops the reader
        self.loader.cancel()
        self._poll.stop()
        self._player.stop()
        super().done(result)


def _about(path: Path, header: dict) -> str:
    # The header is unchecked here (the reader checks it): show plain values only, cut short.
    def field(key: str, default: str = "?") -> str:
        value = header.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}" if abs(value) < 10**30 else default
        return value[:120] if isinstance(value, str) and value else default

    model = Path(field("model", "unknown model")).name
    return (
        f"{path} · {model} · {field('allocator')} allocator · "
        f"{field('num_blocks')} blocks × {field('block_size')} slots"
    )


def _caption() -> QLabel:
    label = QLabel(textFormat=Qt.TextFormat.RichText, wordWrap=True)
    label.setStyleSheet(caption_style(current()))  # before its height is taken from its font
    label.setFixedHeight(3 * label.fontMetrics().lineSpacing() + 4)
    return label


def open_recording(path: str | Path, parent: QWidget | None = None) -> ReplayDialog:
    """The replay dialog for `path`, shown; a file it cannot open raises ValueError/OSError
    with a message for the user."""
    path = Path(path)
    dialog = ReplayDialog(path, check_recording(path), parent)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.show()
    return dialog
