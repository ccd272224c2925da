"""The map's legends: live request groups (click to select) and the key to block states.

Both sit in a column under the maps, whose width runs from ~480 px (a 1024 px window) to ~900 px:
chips elide past a cap so several share a row, and the key picks as many columns as fit.
"""

from __future__ import annotations

import zlib

import numpy as np
from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QIcon, QImage, QPixmap, QResizeEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLayout,
    QListView,
    QListWidget,
    QListWidgetItem,
    QSizePolicy,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QWidget,
)

from kvscope.app.desktop.blockmap import colors, raster
from kvscope.app.desktop.blockmap.glossary import TERMS
from kvscope.app.desktop.palette import Palette
from kvscope.app.desktop.theme import follow_theme
from kvscope.engine.kv.snapshot import BlockState, KVSnapshot, PoolMetrics, SequenceInfo


def list_style(p: Palette) -> str:
    return (
        f"QListWidget {{ background: transparent; border: none; color: {p.text}; }}"
        f" QListWidget::item {{ border: 1px solid {p.border}; border-radius: 4px;"
        f" padding: 2px 6px; margin: 2px; background: {p.surface}; }}"
        f" QListWidget::item:selected {{ border: 1px solid {p.selected_border};"
        f" background: {p.selected}; color: {p.strong}; }}"
        f" QListWidget::item:hover {{ background: {p.hover}; }}"
    )


def _swatch(color_hex: str, size: int = 12) -> QIcon:
    pixmap = QPixmap(size, size)
    pixmap.fill(QColor(color_hex))
    icon = QIcon(pixmap)
    icon.addPixmap(pixmap, QIcon.Mode.Selected)  # no selection tint: the colour is the key
    return icon


CHIP_MAX_PX = 230  # wide enough for "conv-12 · a title's first words", narrow enough for 2-3 a row
CHIP_ROWS = 2  # rows of chips shown; more scroll, so the maps above keep their height


class _CappedChipDelegate(QStyledItemDelegate):
    """Caps a chip's width so a long chat title elides (the tooltip has it whole)."""

    def __init__(self, view: QAbstractItemView) -> None:
        super().__init__(view)
        self._view = view  # its parent, whose width caps the chips'

    def sizeHint(
        self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> QSize:
        size = super().sizeHint(option, index)
        view_width = self._view.viewport().width() - 8  # the chip's margins
        return QSize(max(40, min(size.width(), CHIP_MAX_PX, view_width)), size.height())


class GroupLegend(QListWidget):
    """One chip per live group: colour, label, blocks held. Clicking one selects the group."""

    group_clicked = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFlow(QListView.Flow.LeftToRight)
        self.setWrapping(True)
        self.setResizeMode(QListView.ResizeMode.Adjust)
        self.setIconSize(QSize(12, 12))
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSelectionMode(QListWidget.SelectionMode.SingleSelection)
        self.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.setItemDelegate(_CappedChipDelegate(self))
        self.itemClicked.connect(
            lambda item: self.group_clicked.emit(item.data(Qt.ItemDataRole.UserRole))
        )
        self._shown: list[tuple[str, str]] = []
        self._rows = 1
        self._fit_rows()
        follow_theme(self, self._restyle)

    def _restyle(self, palette: Palette) -> None:
        self.setStyleSheet(list_style(palette))
        for i in range(self.count()):  # each group's colour is the theme's
            item = self.item(i)
            item.setIcon(_swatch(colors.group_hex(item.data(Qt.ItemDataRole.UserRole))))

    def set_groups(self, entries: list[tuple[str, str]], selected: str | None) -> None:
        """entries: (group key, text) in display order; only changed chips are touched."""
        if [g for g, _ in entries] != [g for g, _ in self._shown]:
            self.clear()
            for group, text in entries:
                item = QListWidgetItem(_swatch(colors.group_hex(group)), text)
                item.setData(Qt.ItemDataRole.UserRole, group)
                item.setToolTip(_chip_tip(group, text))
                self.addItem(item)
        else:
            for i, (old, new) in enumerate(zip(self._shown, entries, strict=True)):
                if old[1] != new[1]:
                    self.item(i).setText(new[1])
                    self.item(i).setToolTip(_chip_tip(new[0], new[1]))
        self._shown = list(entries)
        self._fit_rows()
        self.blockSignals(True)
        for i in range(self.count()):
            self.item(i).setSelected(self.item(i).data(Qt.ItemDataRole.UserRole) == selected)
        self.blockSignals(False)

    def groups(self) -> list[tuple[str, str]]:
        """(group, text) of every chip, in order."""
        return list(self._shown)

    def _chip_height(self) -> int:
        # text line + the style sheet's padding (2+2), border (1+1), margin (2+2) and a spare 2
        return max(self.fontMetrics().height(), self.iconSize().height()) + 12

    def _fit_rows(self) -> None:
        """As tall as the rows of chips, one to CHIP_ROWS: no empty row under the maps."""
        self.doItemsLayout()
        tops = {self.visualItemRect(self.item(i)).top() for i in range(self.count())}
        self._rows = max(1, min(CHIP_ROWS, len(tops)))
        # A short window may squeeze it to one row (it scrolls) before the maps lose more.
        self.setMinimumHeight(self._height_of(1))
        self.setMaximumHeight(self._height_of(self._rows))
        self.updateGeometry()

    def _height_of(self, rows: int) -> int:
        return rows * self._chip_height() + 2 * self.frameWidth() + 4

    def sizeHint(self) -> QSize:
        return QSize(super().sizeHint().width(), self._height_of(self._rows))

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            # Chip caps and wrapping follow the viewport, resized after this event.
            QTimer.singleShot(0, self, self._fit_rows)


def _chip_tip(group: str, text: str) -> str:
    return (
        f"{text}<br>Click to light up {group}'s blocks on both maps. Blocks it shares with"
        " other sequences (a common system prompt, n samples) are counted as shared; they are"
        " drawn in their first owner's colour with a ring."
    )


# The key's example sequence takes a blue from the palette (index 8): its group number is
# chosen so the group colour hash lands there.
_KEY_GROUP = f"key-{(8 - zlib.crc32(b'key-')) % len(colors.PALETTE)}"
# Short words so two columns fit under a 1024 px window's maps; tooltips say the rest.
KEY_ITEMS = (
    ("free", "free"),
    ("cached", "cached (free, reusable prefix)"),
    ("full", "in use (request group's colour)"),
    ("partial", "filling (bar = slots written)"),
    ("shared", "shared: ring, stronger = more"),
    ("reserved", "reserved, empty (naive)"),
)


def key_snapshot() -> KVSnapshot:
    """A six-block pool showing each state once, in KEY_ITEMS order."""
    bs = 16
    state = np.array([0, 2, 1, 1, 1, 3], dtype=np.uint8)
    owner = np.array([-1, -1, 1, 1, 1, 1], dtype=np.int64)
    ref = np.array([0, 0, 1, 1, 3, 0], dtype=np.int32)
    filled = np.array([0, bs, bs, 6, bs, 0], dtype=np.int32)
    seq = SequenceInfo(1, f"{_KEY_GROUP}/0", 0, "running", 32, 38, 38, 0, (2, 3, 4), (5,))
    metrics = PoolMetrics(*((0,) * 19))
    return KVSnapshot(
        0,
        0.0,
        "paged",
        bs,
        len(state),
        state,
        owner,
        ref + (state == BlockState.RESERVED),
        ref,
        filled,
        np.arange(len(state), dtype=np.int32),
        state == BlockState.CACHED,
        (seq,),
        metrics,
    )


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
    """Swatch + words for each block state, in as many columns (3 at most) as the width holds."""

    MAX_COLUMNS = 3

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._grid = QGridLayout(self)
        # Else the grid pins the key's minimum to its current columns and it could never narrow.
        self._grid.setSizeConstraint(QLayout.SizeConstraint.SetNoConstraint)
        self._grid.setContentsMargins(4, 0, 4, 0)
        self._grid.setHorizontalSpacing(14)
        self._grid.setVerticalSpacing(3)
        self.entries: list[QWidget] = []
        self.swatches: dict[str, QLabel] = {}
        self.words: list[QLabel] = []
        for name, text in KEY_ITEMS:
            entry = QWidget()
            row = QHBoxLayout(entry)
            row.setContentsMargins(0, 0, 0, 0)
            row.setSpacing(6)
            swatch = self.swatches[name] = QLabel()
            words = QLabel(text)
            self.words.append(words)
            if name in TERMS:
                swatch.setToolTip(f"<p>{TERMS[name]}</p>")
                words.setToolTip(f"<p>{TERMS[name]}</p>")
            row.addWidget(swatch)
            row.addWidget(words, 1)
            self.entries.append(entry)
        self.columns = 0
        self._arrange(2)
        follow_theme(self, self._restyle)

    def _restyle(self, palette: Palette) -> None:
        """Swatches drawn again in the theme's map colours; the words in its detail colour."""
        pixmaps = key_pixmaps()
        for name, swatch in self.swatches.items():
            swatch.setPixmap(pixmaps[name])
        for words in self.words:
            words.setStyleSheet(f"color: {palette.detail}; font-size: 11px;")

    def _columns_for(self, width: int) -> int:
        entry = max(e.sizeHint().width() for e in self.entries)
        margins = self._grid.contentsMargins()
        room = width - margins.left() - margins.right() + self._grid.horizontalSpacing()
        fit = room // (entry + self._grid.horizontalSpacing())
        return max(1, min(self.MAX_COLUMNS, fit))

    def _arrange(self, columns: int) -> None:
        if columns == self.columns:
            return
        self.columns = columns
        for entry in self.entries:
            self._grid.removeWidget(entry)
        for i, entry in enumerate(self.entries):
            row, col = divmod(i, columns)
            self._grid.addWidget(entry, row, col)
        for col in range(self.MAX_COLUMNS):
            self._grid.setColumnStretch(col, 1 if col < columns else 0)

    def minimumSizeHint(self) -> QSize:
        # One column is the least it needs: the key must never set the panel's width.
        entry = max(e.sizeHint().width() for e in self.entries)
        margins = self._grid.contentsMargins()
        return QSize(entry + margins.left() + margins.right(), super().minimumSizeHint().height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._arrange(self._columns_for(event.size().width()))
