"""StructuredOutputField: the sampling panel's "Structured output (JSON Schema)" box and editor.

The editor shows while the box is checked. What is typed is checked 300 ms after the last key:
as JSON here, at once, then whether the engine can compile it, off the GUI thread (the first
compile wraps the model's vocabulary, up to ~1.5 s): `check_requested(ticket, schema)` goes out
and `show_check(ticket, error)` comes back; an answer about an older text is dropped. A problem
shows in red under the editor, and `problem()` tells Send to refuse. `changed` goes out with the
check (not per key), so a chat's setting is stored once the typing pauses, or on `flush()`.
"""

from __future__ import annotations

import itertools

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QCheckBox, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

from kvscope.app.desktop.chat.structured_output import StructuredOutput, parse_schema
from kvscope.app.desktop.palette import Palette
from kvscope.app.desktop.theme import follow_theme

CHECK_DELAY_MS = 300
EDITOR_LINES = 7  # tall enough for a small schema; a longer one scrolls in the editor
PLACEHOLDER = (
    '{"type": "object",\n "properties": {"city": {"type": "string"}},\n "required": ["city"]}'
)


class StructuredOutputField(QWidget):
    changed = Signal(object)  # StructuredOutput: the user turned it on or off, or typed
    check_requested = Signal(int, object)  # ticket, the schema (a dict): can the engine use it?
    shown_changed = Signal(bool)  # the box was checked or unchecked (replies show as JSON)
    problem_changed = Signal(str)  # the red line under the editor, "" when none

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("structuredOutput")
        self.enabled = QCheckBox("Structured output (JSON Schema)")
        self.enabled.setObjectName("structuredOutputBox")
        self.enabled.setToolTip(
            "Every reply of this chat follows this JSON Schema: the engine allows only the "
            "tokens that keep the reply valid"
        )
        self.editor = QPlainTextEdit()
        self.editor.setObjectName("schemaEditor")
        self.editor.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.editor.setPlaceholderText(PLACEHOLDER)
        self.editor.setTabChangesFocus(True)  # Tab leaves the editor, as in the other knobs
        lines = self.editor.fontMetrics().lineSpacing()
        frame = 2 * (self.editor.frameWidth() + int(self.editor.document().documentMargin()))
        self.editor.setFixedHeight(EDITOR_LINES * lines + frame)
        self.editor.setVisible(False)
        self.error = QLabel(wordWrap=True)
        self.error.setObjectName("schemaError")
        self.error.setVisible(False)
        follow_theme(self.error, self._restyle)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        layout.addWidget(self.enabled)
        layout.addWidget(self.editor)
        layout.addWidget(self.error)
        self._tickets = itertools.count(1)
        self._ticket = 0  # the check of the text on show; older answers are dropped
        self._problem = ""  # what is wrong with the text on show, "" when nothing (known)
        self._timer = QTimer(self, singleShot=True, interval=CHECK_DELAY_MS)
        self._timer.timeout.connect(self._typed)
        self.enabled.toggled.connect(self._toggled)
        self.editor.textChanged.connect(self._timer.start)

    # ---- what the panel and the controller use -------------------------------------------
    def value(self) -> StructuredOutput:
        return StructuredOutput(self.enabled.isChecked(), self.editor.toPlainText())

    def set_value(self, value: StructuredOutput) -> None:
        """Show a chat's setting without reporting it as a change (any typing still waiting is
        dropped: `flush()` first to keep it)."""
        self._timer.stop()
        for widget in (self.enabled, self.editor):
            widget.blockSignals(True)
        self.enabled.setChecked(value.on)
        if value.schema != self.editor.toPlainText():  # else the cursor stays where it is
            self.editor.setPlainText(value.schema)
        for widget in (self.enabled, self.editor):
            widget.blockSignals(False)
        self.editor.setVisible(value.on)
        self._check()

    def flush(self) -> None:
        """Check and report typing that is still waiting out its delay, now."""
        if self._timer.isActive():
            self._timer.stop()
            self._typed()

    def problem(self) -> str:
        """Why a reply cannot use the schema on show; "" when it is off, or fine as far as is
        known (the engine's answer may still be on its way: the engine checks it again)."""
        self.flush()
        return self._problem if self.enabled.isChecked() else ""

    def recheck(self) -> None:
        """Ask again (a new engine may read the schema differently)."""
        self._check()

    def show_check(self, ticket: int, error: object) -> None:
        """The engine's answer: "" (it compiles), why it does not, or None (no engine to ask)."""
        if ticket == self._ticket and isinstance(error, str) and error:
            self._show_problem(f"The engine cannot use this schema: {error}")

    # ---- internals -----------------------------------------------------------------------
    def _toggled(self, on: bool) -> None:
        self.editor.setVisible(on)
        self._timer.stop()
        self._check()
        self.shown_changed.emit(on)
        self.changed.emit(self.value())
        if on:
            self.editor.setFocus()

    def _typed(self) -> None:
        self._check()
        self.changed.emit(self.value())

    def _check(self) -> None:
        self._ticket = next(self._tickets)
        if not self.enabled.isChecked():
            self._show_problem("")
            return
        try:
            schema = parse_schema(self.editor.toPlainText())
        except ValueError as e:
            self._show_problem(str(e))
            return
        self._show_problem("")
        self.check_requested.emit(self._ticket, schema)

    def _show_problem(self, text: str) -> None:
        if text == self._problem:
            return
        self._problem = text
        self.error.setText(text)
        self.error.setVisible(bool(text))
        self.problem_changed.emit(text)

    def _restyle(self, palette: Palette) -> None:
        self.error.setStyleSheet(f"color: {palette.error};")
