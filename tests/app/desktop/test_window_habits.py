"""Habits of desktop chat apps: Ctrl+, opens settings, Delete deletes the selected chat, a light
theme that follows the system (View > Theme), and a question before quitting mid-reply."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QKeySequence
from PySide6.QtWidgets import QApplication, QMessageBox

import kvscope.app.desktop.theme as theme_module
import kvscope.app.desktop.window as window_module
from kvscope.app.core.paths import ASSETS_DIR
from kvscope.app.core.settings import AppSettings
from kvscope.app.desktop.chat import conversation_list
from kvscope.app.desktop.settings.dialog import SettingsDialog
from kvscope.app.desktop.theme import resolve_theme

YES, NO = QMessageBox.StandardButton.Yes, QMessageBox.StandardButton.No


def _sheet(name: str) -> str:
    return (ASSETS_DIR / name).read_text()


def test_ctrl_comma_opens_the_settings(make_window, qtbot):
    window = make_window()
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window)
    qtbot.keyClick(window.chat, Qt.Key_Comma, Qt.ControlModifier)
    dialog = window.findChild(SettingsDialog)
    assert dialog is not None and dialog.isVisible()
    dialog.reject()


@pytest.mark.parametrize("answer", [YES, NO])
def test_delete_in_the_chat_list_deletes_the_open_chat_after_asking(
    make_window, qtbot, monkeypatch, answer
):
    window = make_window()
    keep = window.chats.new_conversation()
    doomed = window.chats.new_conversation()
    asked = []
    monkeypatch.setattr(
        conversation_list.QMessageBox, "question", lambda *a: asked.append(a[2]) or answer
    )
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window)
    window.conversations.list.setFocus()
    qtbot.keyClick(window.conversations.list, Qt.Key_Delete)
    assert len(asked) == 1
    ids = [c.id for c in window.store.conversations()]
    assert keep in ids and (doomed in ids) == (answer == NO)


def test_delete_while_typing_edits_the_text_and_keeps_the_chat(make_window, qtbot, monkeypatch):
    window = make_window()
    cid = window.chats.new_conversation()
    monkeypatch.setattr(conversation_list.QMessageBox, "question", lambda *a: pytest.fail())
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window)
    window.conversations.search.setFocus()
    window.conversations.search.setText("ab")
    window.conversations.search.setCursorPosition(0)
    qtbot.keyClick(window.conversations.search, Qt.Key_Delete)
    assert window.conversations.search.text() == "b"
    assert cid in [c.id for c in window.store.conversations()]


def test_the_delete_action_shows_its_key_in_the_chat_menu(make_window):
    window = make_window()
    assert window.menus.delete_chat.shortcut() == QKeySequence(QKeySequence.Delete)
    chat_menu = window.menuBar().actions()[0].menu()
    assert window.menus.delete_chat in chat_menu.actions()


def test_system_theme_follows_the_platform_scheme():
    assert resolve_theme("system", Qt.ColorScheme.Light) == "light"
    assert resolve_theme("system", Qt.ColorScheme.Dark) == "dark"
    assert resolve_theme("system", Qt.ColorScheme.Unknown) == "dark"
    assert resolve_theme("light", Qt.ColorScheme.Dark) == "light"


def test_view_menu_themes_apply_persist_and_follow_the_system(make_window, monkeypatch):
    window = make_window()
    app = QApplication.instance()
    window.menus.themes["light"].trigger()
    assert window.settings.theme == "light" and app.styleSheet() == _sheet("style_light.qss")
    assert AppSettings.from_dict(window.settings.to_dict()).theme == "light"
    window.menus.themes["dark"].trigger()
    assert app.styleSheet() == _sheet("style.qss")
    assert window.menus.themes["dark"].isChecked() and not window.menus.themes["light"].isChecked()
    window.menus.themes["system"].trigger()
    monkeypatch.setattr(theme_module, "system_scheme", lambda: Qt.ColorScheme.Light)
    QGuiApplication.styleHints().colorSchemeChanged.emit(Qt.ColorScheme.Light)
    assert app.styleSheet() == _sheet("style_light.qss")
    window.set_theme("dark")  # a fixed choice ignores the platform
    QGuiApplication.styleHints().colorSchemeChanged.emit(Qt.ColorScheme.Light)
    assert app.styleSheet() == _sheet("style.qss")


def test_a_bad_theme_in_the_settings_file_is_refused():
    with pytest.raises(ValueError, match="theme"):
        AppSettings.from_dict({"theme": "sepia"})
    assert AppSettings.from_dict({}).theme == "system"


def test_quit_asks_while_a_reply_streams(make_window, qtbot, monkeypatch):
    window = make_window(max_tokens=400)
    answers = [NO, YES]
    asked = []
    monkeypatch.setattr(
        window_module.QMessageBox, "question", lambda *a, **k: asked.append(a[2]) or answers.pop(0)
    )
    window.chats.send_message("Write a long story about a dragon.")
    assert window.chats.pending
    window.request_quit()
    assert window.isVisible() and window.chats.pending  # "No": nothing stops
    window.request_quit()
    assert not window.isVisible()
    assert len(asked) == 2 and "still being generated" in asked[0]


def test_quit_without_replies_in_flight_does_not_ask(make_window, monkeypatch):
    window = make_window()
    monkeypatch.setattr(window_module.QMessageBox, "question", lambda *a: pytest.fail())
    window.request_quit()
    assert not window.isVisible()


def test_the_chat_menu_exports_the_open_chat(make_window, monkeypatch):
    window = make_window()
    window.chats.new_conversation()
    exported = []
    monkeypatch.setattr(window.conversations, "ask_export", lambda c, f: exported.append((c, f)))
    labels = {a.text(): a for a in window.menuBar().actions()[0].menu().actions()}
    labels["Export chat as Markdown…"].trigger()
    labels["Export chat as JSON…"].trigger()
    assert exported == [(window.chats.current_id, "markdown"), (window.chats.current_id, "json")]
