"""A closed settings dialog is freed: the window opened a new one each time (Ctrl+,) and kept
every one, as its child and through the lambda its accepted signal calls (two alive after two
opens in the long drive, each with its picker's copies of a model's header and its found list).
"""

from __future__ import annotations

import gc
import weakref

from PySide6.QtCore import Qt

from kvscope.app.desktop.settings.dialog import SettingsDialog


def _reject(qtbot, dialog: SettingsDialog) -> None:
    dialog.reject()  # Cancel


def _escape(qtbot, dialog: SettingsDialog) -> None:
    qtbot.keyClick(dialog, Qt.Key_Escape)


def _apply(qtbot, dialog: SettingsDialog) -> None:
    dialog.policy.setCurrentIndex(dialog.policy.findData("drop_oldest"))  # no rebuild
    dialog._accept()  # Apply


def test_three_opened_and_closed_dialogs_leave_none_alive(make_window, qtbot):
    window = make_window()
    assert window.settings.overflow_policy == "stop"
    gc.disable()  # freed by reference counts alone, as the app's long sessions need
    try:
        for close in (_reject, _escape, _apply):
            dialog = window.open_settings()
            qtbot.waitUntil(dialog.isVisible)
            freed = weakref.ref(dialog)
            close(qtbot, dialog)
            del dialog
            qtbot.waitUntil(lambda freed=freed: freed() is None, timeout=5_000)
            assert window.findChildren(SettingsDialog) == []
    finally:
        gc.enable()
    # Apply reached the window before its dialog went.
    assert window.settings.overflow_policy == "drop_oldest"
