"""FileTable: one repo's GGUF models, each with its quant, size, this machine's verdict and a
Download button.

A split GGUF (`-00001-of-0000N`) is one row. Verdicts are asked for lazily: only for the rows
in view, when they come into view (a repo of forty quants reads a few headers, not forty), by
`verdicts_wanted`; the window's HubJobs answers and `set_verdict` fills the cell. The whole
sentence of the planner is the cell's tooltip and, for the selected row, the details line
under the table (app/desktop/get_model/file_panel.py).
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QWidget,
)

from kvscope.app.desktop import palette
from kvscope.app.desktop.get_model.hub_jobs import FileKey, file_key
from kvscope.app.desktop.get_model.texts import CHECKING, file_label, size, verdict_cell

if TYPE_CHECKING:
    from kvscope.app.core.hub.search import FitVerdict, HubFile

COLUMNS = ("File", "Quant", "Size", "This machine", "")
FILE, QUANT, SIZE, VERDICT, ACTION = range(len(COLUMNS))


class FileTable(QTableWidget):
    verdicts_wanted = Signal(object)  # list[HubFile]: rows in view without a verdict
    download_requested = Signal(object)  # HubFile
    file_selected = Signal(object)  # HubFile | None

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(0, len(COLUMNS), parent)
        self.setObjectName("hubFiles")
        self.setHorizontalHeaderLabels(COLUMNS)
        self.verticalHeader().hide()
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.setWordWrap(False)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        header = self.horizontalHeader()
        header.setSectionResizeMode(FILE, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(VERDICT, QHeaderView.ResizeMode.Stretch)
        for column in (QUANT, SIZE, ACTION):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        self.setMinimumWidth(420)
        self._files: list[HubFile] = []
        self._rows: dict[FileKey, int] = {}
        # One pass after a burst of scrolls and resizes, once the rows are laid out.
        self._look = QTimer(self, singleShot=True, interval=50)
        self._look.timeout.connect(self._ask_for_visible)
        self.verticalScrollBar().valueChanged.connect(self._look.start)
        self.itemSelectionChanged.connect(self._selection_changed)

    def set_files(self, files: list[HubFile], verdicts: dict[FileKey, FitVerdict | str]) -> None:
        """Show `files`, with the verdicts known already; the rest are asked for in view."""
        self.clearContents()
        self.setRowCount(len(files))
        self._files = list(files)
        self._rows = {file_key(f): row for row, f in enumerate(files)}
        for row, hub_file in enumerate(files):
            name = QTableWidgetItem(file_label(hub_file))
            parts = "\n".join(hub_file.parts) if len(hub_file.parts) > 1 else hub_file.file
            name.setToolTip(f"{hub_file.repo}\n{parts}\nsha256: {hub_file.sha256 or 'not listed'}")
            self.setItem(row, FILE, name)
            self.setItem(row, QUANT, QTableWidgetItem(hub_file.quant or "—"))
            size_item = QTableWidgetItem(size(hub_file.size_bytes))
            size_item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.setItem(row, SIZE, size_item)
            self.setItem(row, VERDICT, QTableWidgetItem(""))
            known = verdicts.get(file_key(hub_file))
            if known is not None:
                self.set_verdict(file_key(hub_file), known)
            button = QPushButton("Download")
            button.setObjectName("downloadFile")
            button.setToolTip(f"Download {hub_file.file} into the Hugging Face cache")
            button.clicked.connect(
                lambda _checked=False, f=hub_file: self.download_requested.emit(f)
            )
            self.setCellWidget(row, ACTION, button)
        self._look.start()

    def files(self) -> list[HubFile]:
        return list(self._files)

    def row_of(self, key: FileKey) -> int | None:
        return self._rows.get(key)

    def set_verdict(self, key: FileKey, verdict: FitVerdict | str) -> None:
        """Fill a row's verdict cell (a key not shown now is ignored)."""
        row = self._rows.get(key)
        item = self.item(row, VERDICT) if row is not None else None
        if item is None:
            return
        if isinstance(verdict, str):
            item.setText("? no verdict")
            item.setToolTip(f"<p>The header could not be read: {html.escape(verdict)}</p>")
            item.setForeground(QBrush())
            return
        item.setText(verdict_cell(verdict))
        self.setHorizontalHeaderItem(
            VERDICT, QTableWidgetItem(f"On this machine ({verdict.device})")
        )
        item.setToolTip(f"<p>{html.escape(verdict.note)}</p>")  # rich text: Qt wraps it
        bad = QColor(palette.current().error) if not verdict.fits else None
        item.setForeground(QBrush(bad) if bad is not None else QBrush())

    def verdict_text(self, key: FileKey) -> str:
        row = self._rows.get(key)
        item = self.item(row, VERDICT) if row is not None else None
        return item.text() if item is not None else ""

    def download_button(self, key: FileKey) -> QPushButton | None:
        row = self._rows.get(key)
        widget = self.cellWidget(row, ACTION) if row is not None else None
        return widget if isinstance(widget, QPushButton) else None

    def visible_rows(self) -> range:
        """The rows the viewport shows now (empty while there are none or it is hidden)."""
        if not self.rowCount() or not self.isVisible():
            return range(0)
        top = self.rowAt(0)
        bottom = self.rowAt(self.viewport().height() - 1)
        return range(max(top, 0), (bottom if bottom >= 0 else self.rowCount() - 1) + 1)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._look.start()

    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        self._look.start()

    def _ask_for_visible(self) -> None:
        wanted = []
        for row in self.visible_rows():
            item = self.item(row, VERDICT)
            if item is not None and not item.text():
                item.setText(CHECKING)
                wanted.append(self._files[row])
        if wanted:
            self.verdicts_wanted.emit(wanted)

    def _selection_changed(self) -> None:
        rows = {index.row() for index in self.selectedIndexes()}
        self.file_selected.emit(self._files[min(rows)] if rows else None)
