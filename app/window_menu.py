"""The window's menu bar: Chat (new chat, settings, quit) and Engine (settings, pause the map)."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMainWindow


def build_menus(
    window: QMainWindow,
    new_chat: Callable[[], object],
    open_settings: Callable[[], object],
    set_map_paused: Callable[[bool], None],
) -> QAction:
    """Fill the window's menu bar; returns the checkable "Pause block map" action."""
    menu = window.menuBar().addMenu("&Chat")
    new = QAction("New chat", window, shortcut=QKeySequence.New)
    new.triggered.connect(new_chat)
    settings = QAction("Model and engine…", window, shortcut=QKeySequence.Preferences)
    settings.triggered.connect(open_settings)
    quit_ = QAction("Quit", window, shortcut=QKeySequence.Quit)
    quit_.triggered.connect(window.close)
    menu.addActions([new, settings])
    menu.addSeparator()
    menu.addAction(quit_)
    engine_menu = window.menuBar().addMenu("&Engine")
    engine_menu.addAction(settings)
    pause_map = QAction("Pause block map", window, checkable=True)
    pause_map.setToolTip("Hold the map still to inspect it; the engine runs on")
    pause_map.toggled.connect(set_map_paused)
    engine_menu.addAction(pause_map)
    return pause_map
