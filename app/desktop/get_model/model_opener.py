"""ModelOpener: a downloaded model's Open button, which loads it into the window's engine the way
Engine ▸ Model and engine… does, or offers that dialog when its settings would not build.

The dialog's Apply checks the chosen model's headers against the settings (app/desktop/settings/
build_check.py: max model length within the model's context, a KV budget that holds a block,
weights that fit the memory free beside what the running engine gives back), then hands the
settings to the window's `apply_settings`, which rebuilds the engine in its worker thread. Open
does the same: the headers are read on a thread of their own (the picker's cache,
app/desktop/models/headers.py), the max model length is lowered to the model's context as the
dialog lowers it, and settings that pass go to `apply_settings`. Settings that do not open the
dialog on this model, where the planner's figures and the problem show and the knobs can move.
A rebuild stops the replies in flight, so while one streams the user is asked first (without
a blocking dialog).
"""

from __future__ import annotations

import threading
from dataclasses import replace

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QMessageBox

from kvscope.app.core.settings import AppSettings
from kvscope.app.desktop.models.headers import Headers, read_headers
from kvscope.app.desktop.settings.build_check import build_problems, context_limit
from kvscope.app.desktop.settings.dialog import SettingsDialog, _freed_bytes


class _Reports(QObject):
    headers_read = Signal(str, object)  # path, (ModelConfig, WeightsHeader | None) | str


class ModelOpener(QObject):
    opened = Signal(object)  # the AppSettings handed to the window (tests, the status line)
    dialog_offered = Signal(object)  # the SettingsDialog opened instead

    def __init__(self, window) -> None:
        """`window`: the MainWindow (passed in, not imported: it imports this package)."""
        super().__init__(window)
        self.window = window
        self._reports = _Reports()  # parentless: a late answer has a live sender
        self._reports.headers_read.connect(self._headers_read)

    def open(self, path: str) -> None:
        """Load the model at `path` (a GGUF in the Hugging Face cache); returns at once."""
        self.window.status.showMessage(f"Reading {path}…", 5_000)
        reports = self._reports
        threading.Thread(
            target=_read, args=(path, reports), name="kvscope-open-model", daemon=True
        ).start()

    def _headers_read(self, path: str, result: Headers | str) -> None:
        window = self.window
        if isinstance(result, str):
            window.show_error("The model cannot be opened", f"{path}: {result}")
            return
        mc, header = result
        chosen = replace(window.settings, engine=replace(window.settings.engine, model=path))
        settings = _clamped(chosen, context_limit(mc))
        problems = build_problems(settings.engine, mc, header, _freed_bytes(window.engine_info))
        if problems:
            self._offer_dialog(chosen)
        elif window.chats.pending:
            self._ask_then_apply(settings)
        else:
            self._apply(settings)

    def _offer_dialog(self, settings: AppSettings) -> None:
        """The settings dialog on this model: its prediction, the problem, the knobs."""
        window = self.window
        dialog = SettingsDialog(settings, window, running=window.engine_info)
        dialog.accepted.connect(lambda: window.apply_settings(dialog.result_settings()))
        dialog.open()
        self.dialog_offered.emit(dialog)

    def _ask_then_apply(self, settings: AppSettings) -> None:
        n = len(self.window.chats.pending)
        replies = "A reply is" if n == 1 else f"{n} replies are"
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "Open the model",
            f"{replies} still being generated. Loading the model stops {'it' if n == 1 else 'them'}"
            " (what is written so far is kept). Load it now?",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            self.window,
        )
        box.setObjectName("openModelQuestion")

        def answered(_result: int) -> None:
            if box.clickedButton() is box.button(QMessageBox.StandardButton.Yes):
                self._apply(settings)

        box.finished.connect(answered)
        box.open()

    def _apply(self, settings: AppSettings) -> None:
        self.window.apply_settings(settings)
        self.window.status.showMessage(f"Loading {settings.engine.model}…", 10_000)
        self.opened.emit(settings)


def _clamped(settings: AppSettings, limit: int) -> AppSettings:
    """Max model length at most the model's context, the user's own length kept as wanted (the
    settings dialog's clamp)."""
    length = settings.engine.max_model_len
    if length is None or length <= limit:
        return settings
    engine = replace(settings.engine, max_model_len=limit)
    return replace(settings, engine=engine, wanted_max_model_len=length)


def _read(path: str, reports: _Reports) -> None:
    """The thread: the model's headers, or why they cannot be read."""
    try:
        reports.headers_read.emit(path, read_headers(path))
    except Exception as e:  # any unreadable file: said in the window's error dialog
        reports.headers_read.emit(path, f"{type(e).__name__}: {e}")
