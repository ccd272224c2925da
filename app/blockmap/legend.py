"""The map's legends: live request groups (click to select) and the key to block states."""

from __future__ import annotations

import zlib

import numpy as np
from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QColor, QIcon, QImage, QPixmap
from PySide6.QtWidgets import (
    QGridLayout,
    QLabel,
    QListView,
    QListWidget,
    QListWidgetItem,
    QWidget,
)

from app.blockmap import colors, raster
from engine.kv.snapshot import BlockState, KVSnapshot, PoolMetrics, SequenceInfo

LIST_STYLE = (
    "QListWidget { background: transparent; border: none; color: #D5D9E0; }"
    " QListWidget::item { border: 1px solid #2C313B; border-radius: 4px; padding: 2px 6px;"
    " margin: 2px; background: #1D2027; }"
    " QListWidget::item:selected { border: 1px solid #E8EAED; background: #2A2F39; }"
    " QListWidget::item:hover { background: #262A33; }"
)


def _swatch(color_hex: str, size: int = 12) -> QIcon:
    pixmap = QPixmap(size, size)
    pixmap.fill(QColor(color_hex))
    icon = QIcon(pixmap)
    icon.addPixmap(pixmap, QIcon.Mode.Selected)  # no selection tint: the colour is the key
    return icon


class GroupLegend(QListWidget):
    """One chip per live group: colour, label, blocks held. Clicking one selects the group."""

    group_clicked = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setStyleSheet(LIST_STYLE)
        self.setFlow(QListView.Flow.LeftToRight)
        self.setWrapping(True)
        self.setResizeMode(QListView.ResizeMode.Adjust)
        self.setIconSize(QSize(12, 12))
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSelectionMode(QListWidget.SelectionMode.SingleSelection)
        self.itemClicked.connect(lambda item: self.group_clicked.emit(item.data(Qt.UserRole)))
        self._shown: list[tuple[str, str]] = []

    def set_groups(self, entries: list[tuple[str, str]], selected: str | None) -> None:
        """entries: (group key, text) in display order; only changed chips are touched."""
        if [g for g, _ in entries] != [g for g, _ in self._shown]:
            self.clear()
            for group, text in entries:
                item = QListWidgetItem(_swatch(colors.group_hex(group)), text)
                item.setData(Qt.UserRole, group)
                self.addItem(item)
        else:
            for i, (old, new) in enumerate(zip(self._shown, entries, strict=True)):
                if old[1] != new[1]:
                    self.item(i).setText(new[1])
        self._shown = list(entries)
        self.blockSignals(True)
        for i in range(self.count()):
            self.item(i).setSelected(self.item(i).data(Qt.UserRole) == selected)
        self.blockSignals(False)

    def groups(self) -> list[tuple[str, str]]:
        """(group, text) of every chip, in order."""
        return list(self._shown)


# The key's example sequence takes a blue from the palette (index 8): its group number is
# chosen so the group colour hash lands there.
_KEY_GROUP = f"key-{(8 - zlib.crc32(b'key-')) % len(colors.PALETTE)}"
KEY_ITEMS = (
    ("free", "free"),
    ("cached", "cached: free, still holds a reusable prefix"),
    ("full", "in use, in its request group's colour"),
    ("partial", "filling: bar = share of its slots written"),
    ("shared", "shared: ring (brighter = more sequences)"),
    ("reserved", "reserved but empty (naive allocator)"),
)


def key_snapshot() -> KVSnapshot:
    """A six-block pool showing each state once, in KEY_ITEMS order."""
    bs = 16
    state = np.array([0, 2, 1, 1, 1, 3], dtype=np.uint8)
    owner = np.array([-1, -1, 1, 1, 1, 1], dtype=np.int64)
    ref = np.array([0, 0, 1, 1, 3, 0], dtype=np.int32)
    filled = np.array([0, bs, bs, 6, bs, 0], dtype=np.int32)
    seq = SequenceInfo(1, f"{_KEY_GROUP}/0", 0, "running", 32, 38, 38, 0, (2, 3, 4), (5,))
    metrics = PoolMetrics(*([0] * 19))
    return KVSnapshot(
        0, 0.0, "paged", bs, len(state), state, owner, ref + (state == BlockState.RESERVED),
        ref, filled, np.arange(len(state), dtype=np.int32), state == BlockState.CACHED,
        (seq,), metrics,
    )  # fmt: skip


def key_pixmaps(cell_px: int = 14) -> dict[str, QPixmap]:
    """Swatches drawn by the map's own rasterizer, so the key cannot drift from the map."""
    rgba = raster.rasterize(key_snapshot(), cols=len(KEY_ITEMS), cell_px=cell_px)
    out = {}
    for i, (name, _text) in enumerate(KEY_ITEMS):
        cell = np.ascontiguousarray(rgba[: cell_px - 1, i * cell_px : (i + 1) * cell_px - 1])
        image = QImage(cell.data, cell.shape[1], cell.shape[0], QImage.Format.Format_RGBA8888)
        out[name] = QPixmap.fromImage(image.copy())
    return out


class StateKey(QWidget):
    """Swatch + words for each block state, in two rows."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QGridLayout(self)
        layout.setContentsMargins(4, 0, 4, 0)
        layout.setHorizontalSpacing(6)
        layout.setVerticalSpacing(3)
        pixmaps = key_pixmaps()
        per_row = 2
        for i, (name, text) in enumerate(KEY_ITEMS):
            swatch = QLabel()
            swatch.setPixmap(pixmaps[name])
            words = QLabel(text)
            words.setStyleSheet("color: #A9B0BD; font-size: 11px;")
            row, col = divmod(i, per_row)
            layout.addWidget(swatch, row, 2 * col)
            layout.addWidget(words, row, 2 * col + 1)
