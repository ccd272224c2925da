"""RoutingBox: the cache-aware routing question for a new prompt: how many of its blocks does
each replica already hold?

"Check" tokenizes the prompt on every replica (each server's own chat template and
tokenizer: POST /tokenize), each call in a worker thread, then asks app/remote/routing.py to
count the leading blocks each replica holds (by vLLM's block hashes where they can be
reproduced, else by the events' token ids) and shows one row per replica, the best lit. The
table, its best row and the captions follow the theme (`follow_theme`)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.desktop.blockmap.colors import themed_hex
from kvscope.app.desktop.palette import DARK, Palette, current
from kvscope.app.desktop.theme import follow_theme
from kvscope.app.remote.connection import Connection

# tokenize(connection, model or None, chat messages) -> the token ids that server makes of them
Tokenize = Callable[[Connection, str | None, list[dict]], list[int]]


def table_style(p: Palette) -> str:
    return (
        f"QTableWidget {{ background: {p.well}; border: 1px solid {p.border}; color: {p.text};"
        f" font-size: 11px; gridline-color: {p.handle}; }}"
        f" QHeaderView::section {{ background: {p.surface}; color: {p.muted}; border: none;"
        " padding: 2px 6px; font-size: 10px; font-weight: bold; }"
    )


COLUMNS = ("REPLICA", "BLOCKS HELD", "TOKENS HELD", "METHOD")


def tokenize_over_http(
    connection: Connection, model: str | None, messages: list[dict]
) -> list[int]:
    """POST /tokenize of the messages with the server's chat template: what a chat sends, so
    the blocks counted are the ones that chat's request would reuse."""
    from kvscope.app.remote.openai_http import OpenAIHttp

    with OpenAIHttp(connection, timeout=10.0) as http:
        if model is None:
            models = http.models()
            if not models:
                raise ValueError(f"{connection.label} serves no model")
            model = models[0]
        return http.tokenize(model, messages=messages)


class _Bridge(QObject):
    answered = Signal(int, str, object)  # check number, replica, token ids or an Exception


class RoutingBox(QWidget):
    def __init__(self, tokenize: Tokenize | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tokenize = tokenize or tokenize_over_http
        # Called at Check with the replicas to ask: label -> (connection, model or None).
        self.replicas: Callable[[], dict[str, tuple[Connection, str | None]]] = dict
        # Called with every replica's token ids once all answered -> the RouteHits, best first.
        self.predict: Callable[[dict[str, list[int]]], list] = lambda _ids: []
        self.color_of: Callable[[str], str] = lambda _r: DARK.text
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kvscope-tokenize")
        self._bridge = _Bridge(self)
        self._bridge.answered.connect(self._on_answer)
        self._check = 0
        self._closed = False
        self._pending: set[str] = set()
        self._tokens: dict[str, list[int]] = {}
        self._errors: dict[str, str] = {}
        self.hits: list = []

        self.title = QLabel(
            "<b>Routing</b>: which replica holds most of a new prompt?", wordWrap=True
        )
        self.system = QLineEdit(placeholderText="system prompt (optional)")
        self.prompt = QLineEdit(placeholderText="a new prompt (the user's message)")
        self.system.returnPressed.connect(self.check)
        self.prompt.returnPressed.connect(self.check)
        self.button = QPushButton("Check")
        self.button.clicked.connect(self.check)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.prompt, 1)
        row.addWidget(self.button)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setDefaultSectionSize(20)
        self.note = QLabel(
            "Tokenized by each server (/tokenize); blocks counted from the start of the prompt.",
            wordWrap=True,
        )
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 0)
        layout.setSpacing(4)
        layout.addWidget(self.title)
        layout.addWidget(self.system)
        layout.addLayout(row)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.note)
        follow_theme(self, self._restyle)

    def _restyle(self, palette: Palette) -> None:
        self.title.setStyleSheet(f"color: {palette.text}; font-size: 11px;")
        self.note.setStyleSheet(f"color: {palette.muted}; font-size: 10px;")
        self.table.setStyleSheet(table_style(palette))
        if self.hits or self._errors:
            self._show(self.hits)  # the rows' replica colours and the best row, in the theme's

    def messages(self) -> list[dict]:
        system = self.system.text().strip()
        messages = [{"role": "system", "content": system}] if system else []
        return messages + [{"role": "user", "content": self.prompt.text()}]

    def check(self) -> None:
        """Tokenize the prompt on every replica, off the GUI thread; answers come back via a
        queued signal, and an older check's late answers are ignored."""
        text = self.prompt.text()
        messages = self.messages()
        replicas = self.replicas()
        if not text.strip() or not replicas:
            self.note.setText("Type a prompt first." if replicas else "No replica connected.")
            return
        if self._closed:
            return
        self._check += 1
        check = self._check
        self._pending = set(replicas)
        self._tokens, self._errors = {}, {}
        self.note.setText(f"Tokenizing on {len(replicas)} replicas…")
        self.button.setEnabled(False)
        for label, (connection, model) in replicas.items():
            future = self._pool.submit(self.tokenize, connection, model, messages)
            future.add_done_callback(partial(self._answer, check, label))

    def _answer(self, check: int, replica: str, future: Future[list[int]]) -> None:
        """On the worker thread: hand the answer to the GUI thread (queued signal)."""
        if future.cancelled():
            return
        try:
            self._bridge.answered.emit(check, replica, future.exception() or future.result())
        except RuntimeError:  # the box was deleted while the server answered
            pass

    def busy(self) -> bool:
        return bool(self._pending)

    def _on_answer(self, check: int, replica: str, answer: list[int] | BaseException) -> None:
        if check != self._check or replica not in self._pending:
            return
        self._pending.discard(replica)
        if isinstance(answer, BaseException):
            self._errors[replica] = str(answer) or type(answer).__name__
        else:
            self._tokens[replica] = list(answer)
        if not self._pending:
            self.button.setEnabled(True)
            try:
                hits = self.predict(self._tokens) if self._tokens else []
            except Exception as e:  # a cache in a state routing does not expect: say so
                self.note.setText(f"Could not count the blocks held: {e}")
                return
            self._show(hits)

    def _show(self, hits: list) -> None:
        self.hits = hits
        rows = [(h.replica, h) for h in hits] + [(r, None) for r in sorted(self._errors)]
        self.table.setRowCount(len(rows))
        best = hits[0].replica if hits and hits[0].blocks_held > 0 else None
        bold = QFont()
        bold.setBold(True)
        for i, (replica, hit) in enumerate(rows):
            if hit is None:
                cells = [replica, "—", "—", f"tokenize failed: {self._errors[replica]}"]
            else:
                cells = [
                    ("★ " if replica == best else "") + replica,
                    f"{hit.blocks_held:,} / {hit.blocks_in_prompt:,}",
                    f"{hit.tokens_held:,} of {len(self._tokens.get(replica, ())):,}",
                    hit.method,
                ]
            for j, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                if j == 0:
                    item.setForeground(QColor(themed_hex(self.color_of(replica))))
                if replica == best:
                    item.setBackground(QColor(current().best_row))
                    item.setFont(bold)
                self.table.setItem(i, j, item)
        self.table.horizontalHeader().setSectionResizeMode(
            0, QHeaderView.ResizeMode.ResizeToContents
        )
        if best is not None:
            self.note.setText(f"Best: {best} holds {hits[0].blocks_held:,} of the prompt's blocks.")
        elif hits:
            self.note.setText("No replica holds any of this prompt's blocks.")
        else:
            self.note.setText("No replica could tokenize the prompt.")

    def rows(self) -> list[list[str]]:
        """The table as text (for tests)."""
        return [
            [self._cell_text(i, j) for j in range(self.table.columnCount())]
            for i in range(self.table.rowCount())
        ]

    def _cell_text(self, row: int, column: int) -> str:
        item = self.table.item(row, column)
        assert item is not None  # _show fills every cell of the rows it makes
        return item.text()

    def shutdown(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
