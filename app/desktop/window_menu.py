"""The window's menu bar: Chat (new, delete, export, settings, quit), Engine (settings, get a
model, pause the map, recording) and View (the theme).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMenu, QWidget

from kvscope.app.core.settings import THEMES

SETTINGS_KEY = "Ctrl+,"  # LM Studio's, VS Code's; Qt's Preferences key is empty on Linux
SETTINGS_ACTION = "modelSettingsAction"


@dataclass
class WindowMenus:
    pause_map: QAction  # checkable
    delete_chat: QAction
    themes: dict[str, QAction]  # THEMES -> its checkable action


def settings_shortcuts() -> list[QKeySequence]:
    """The platform's Preferences key(s), plus Ctrl+, where that is not already one."""
    keys = QKeySequence.keyBindings(QKeySequence.StandardKey.Preferences)
    comma = QKeySequence(SETTINGS_KEY)
    return keys + [comma] if comma not in keys else keys


def build_menus(
    window: QMainWindow,
    new_chat: Callable[[], object],
    delete_chat: Callable[[], object],
    export_chat: Callable[[str], object],
    open_settings: Callable[[], object],
    set_map_paused: Callable[[bool], None],
    set_theme: Callable[[str], None],
    request_quit: Callable[[], object],
    delete_scope: QWidget,
) -> WindowMenus:
    """Fill the window's menu bar. Delete works while focus is inside `delete_scope` (the chat
    list), so the key keeps its meaning in text boxes."""
    menu = window.menuBar().addMenu("&Chat")
    new = QAction("New chat", window)
    new.setShortcut(QKeySequence.StandardKey.New)
    new.triggered.connect(new_chat)
    delete = QAction("Delete chat…", window)
    delete.setShortcut(QKeySequence.StandardKey.Delete)
    delete.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
    delete.triggered.connect(delete_chat)
    delete_scope.addAction(delete)
    exports = []
    for fmt, label in (("markdown", "Export chat as Markdown…"), ("json", "Export chat as JSON…")):
        action = QAction(label, window)
        action.triggered.connect(lambda _checked, f=fmt: export_chat(f))
        exports.append(action)
    settings = QAction("Model and engine…", window)
    settings.setObjectName(SETTINGS_ACTION)
    settings.setShortcuts(settings_shortcuts())
    settings.triggered.connect(open_settings)
    quit_ = QAction("Quit", window)
    quit_.setShortcut(QKeySequence.StandardKey.Quit)
    quit_.triggered.connect(request_quit)
    menu.addActions([new, delete, *exports, settings])
    menu.addSeparator()
    menu.addAction(quit_)
    engine_menu = window.menuBar().addMenu("&Engine")
    engine_menu.addAction(settings)
    pause_map = QAction("Pause block map", window, checkable=True)
    pause_map.setToolTip("Hold the map still to inspect it; the engine runs on")
    pause_map.toggled.connect(set_map_paused)
    engine_menu.addAction(pause_map)
    theme_menu = window.menuBar().addMenu("&View").addMenu("Theme")
    group = QActionGroup(window)
    group.setExclusive(True)
    themes = {}
    for theme in THEMES:
        label = "System (follow the desktop)" if theme == "system" else theme.capitalize()
        action = QAction(label, group, checkable=True)
        action.triggered.connect(lambda _checked, t=theme: set_theme(t))
        theme_menu.addAction(action)
        themes[theme] = action
    return WindowMenus(pause_map, delete, themes)


def add_engine_actions(window: QMainWindow, actions: list[QAction]) -> None:
    """Append actions (recording: app/desktop/recording/controls.py) to the Engine menu."""
    for action in window.menuBar().actions():
        menu = action.menu()
        # QAction.menu() is typed as a QObject; a menu bar's actions hold QMenus.
        if isinstance(menu, QMenu) and menu.title() == "&Engine":
            menu.addSeparator()
            menu.addActions(actions)
            return


def add_model_action(window: QMainWindow, action: QAction) -> None:
    """Put `action` (Get a model…: app/desktop/get_model/controls.py) in the Engine menu right
    after "Model and engine…", where a user looking for another model looks."""
    for menu_action in window.menuBar().actions():
        menu = menu_action.menu()
        if isinstance(menu, QMenu) and menu.title() == "&Engine":
            actions = menu.actions()
            names = [a.objectName() for a in actions]
            after = names.index(SETTINGS_ACTION) + 1 if SETTINGS_ACTION in names else 0
            if after < len(actions):
                menu.insertAction(actions[after], action)
            else:
                menu.addAction(action)
            return
