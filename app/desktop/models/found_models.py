"""FoundModelsList: the GGUF files already on this computer, as a list to pick from.

The folder walk and the header reads (~0.1 s each) run on a background thread, so the settings
dialog opens at once; rows appear when the walk ends and their quantization fills in as each
header is read. Header reads stop after a time budget. A row is named by its file (Ollama's by
name and tag), elided in the middle so both the model and its quantization suffix stay
readable in the dialog's narrow column; the tooltip has the full name, the path and what the
header says.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QHeaderView,
    QLabel,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.desktop.models import discovery as model_discovery
from kvscope.app.desktop.models.discovery import FoundModel, ModelSummary

DESCRIBE_BUDGET_S = 8.0
COLUMNS = ("Name", "Size", "Quant.", "Where")  # short headers: the name gets the width
HEADER_TIPS = (
    "File name (Ollama: name and tag)",
    "",
    "Quantization: the file's own type",
    "Where it was found: LM Studio, Ollama, the Hugging Face cache, ~/models, recent",
)
PATH_ROLE = Qt.ItemDataRole.UserRole
# A name elided in the middle keeps its model and its quantization readable at this many
# characters ("gemma-3-270…Q4_K_M.gguf"); the cell and the frame take the margins.
NAME_MIN_CHARS = 26
NAME_CELL_MARGINS = 24


def format_size(n: int) -> str:
    for unit, scale, digits in (("GiB", 2**30, 2), ("MiB", 2**20, 0), ("KiB", 2**10, 0)):
        if n >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n} B"


class _ScanReports(QObject):
    """Carries the scan thread's results to the GUI thread (queued: it lives there)."""

    found = Signal(object)  # list[FoundModel]
    described = Signal(int, object)  # row, ModelSummary


class FoundModelsList(QWidget):
    model_chosen = Signal(str)  # the path of the row the user picked

    def __init__(
        self,
        discover: Callable[[], list[FoundModel]],
        note: str = "",
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.tree = QTreeWidget()
        self.tree.setObjectName("foundModels")
        self.tree.setHeaderLabels(COLUMNS)
        for column, tip in enumerate(HEADER_TIPS):
            self.tree.headerItem().setToolTip(column, tip)
        self.tree.setRootIsDecorated(False)
        self.tree.setMinimumHeight(90)
        self.tree.setMaximumHeight(170)
        # The dialog's model column is narrow: the name gives way (its tooltip is the path).
        self.tree.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.tree.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        header = self.tree.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in range(1, len(COLUMNS) - 1):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        # "Hugging Face cache" at its contents' width pushed the column past a 1024 px dialog's
        # edge: the place keeps the width of the shortest ("Ollama"), elided, its tooltip whole.
        header.setSectionResizeMode(len(COLUMNS) - 1, QHeaderView.ResizeMode.Interactive)
        header.resizeSection(
            len(COLUMNS) - 1, self.tree.fontMetrics().horizontalAdvance("Ollama__")
        )
        self.status = QLabel("Looking for GGUF files…", wordWrap=True)
        self.status.setObjectName("hintText")
        self._note = note
        self.scan_done = False
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(QLabel("GGUF files on this computer"))
        layout.addWidget(self.tree, 1)
        layout.addWidget(self.status)
        self.tree.itemActivated.connect(self._chosen)
        self.tree.itemClicked.connect(self._chosen)
        self._reports = _ScanReports()
        self._reports.found.connect(self._show_found)
        self._reports.described.connect(self._show_summary)
        reports = self._reports  # the thread keeps it alive, not the (maybe closed) widget
        threading.Thread(
            target=_scan, args=(discover, reports), name="kvscope-model-scan", daemon=True
        ).start()

    def paths(self) -> list[str]:
        return [item.data(0, PATH_ROLE) for item in self._rows()]

    def _rows(self) -> list[QTreeWidgetItem]:
        """The list's rows, in order (every index under topLevelItemCount() holds one)."""
        items = (self.tree.topLevelItem(i) for i in range(self.tree.topLevelItemCount()))
        return [item for item in items if item is not None]

    def _show_found(self, models: list[FoundModel]) -> None:
        for model in models:
            item = QTreeWidgetItem([model.title, format_size(model.size_bytes), "…", model.source])
            item.setData(0, PATH_ROLE, str(model.path))
            item.setToolTip(0, f"{model.title}\n{model.path}")
            item.setToolTip(len(COLUMNS) - 1, model.source)
            self.tree.addTopLevelItem(item)
        where = (
            "the LM Studio, GPT4All, Jan and Ollama folders, the Hugging Face cache, ~/models"
            " and recent models"
        )
        line = f"{len(models)} found in {where}." if models else f"None found in {where}."
        self.status.setText(" ".join(part for part in (line, self._note) if part))

    def _show_summary(self, row: int, summary: ModelSummary | None) -> None:
        if summary is None:  # the header budget ran out, or the scan ended
            self.scan_done = True
            for listed in self._rows():
                if listed.text(2) == "…":
                    listed.setText(2, "")
            self._keep_names_readable()
            return
        item = self.tree.topLevelItem(row)
        if item is None:
            return
        item.setText(2, summary.quantization or ("unreadable" if summary.error else ""))
        item.setToolTip(2, summary.error or summary.details)
        if summary.details:
            item.setToolTip(0, f"{item.toolTip(0)}\n{summary.details}")

    def _keep_names_readable(self) -> None:
        """The least width that leaves the name column NAME_MIN_CHARS, beside the other columns
        at their contents' width: with the app's style sheet they took so much that a name read
        "gemma-3-2…_K_M.gguf" at the dialog's narrowest (its quantization cut)."""
        others = sum(self.tree.header().sectionSize(c) for c in range(1, len(COLUMNS)))
        name = self.tree.fontMetrics().horizontalAdvance("x" * NAME_MIN_CHARS)
        self.tree.setMinimumWidth(name + others + NAME_CELL_MARGINS)

    def _chosen(self, item: QTreeWidgetItem, _column: int = 0) -> None:
        self.model_chosen.emit(item.data(0, PATH_ROLE))


def _scan(discover: Callable[[], list[FoundModel]], reports: _ScanReports) -> None:
    """The scan thread: walk, report the files, then read their headers one by one."""
    try:
        models = discover()
    except Exception:  # a scan is a convenience: an unexpected failure lists nothing
        models = []
    reports.found.emit(models)
    deadline = time.monotonic() + DESCRIBE_BUDGET_S
    for row, model in enumerate(models):
        if time.monotonic() > deadline:
            break
        reports.described.emit(row, model_discovery.describe(Path(model.path)))
    reports.described.emit(-1, None)
