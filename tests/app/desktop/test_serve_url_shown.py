"""Issue 29: Engine ▸ Serve the engine shows where it serves: the URL and port in the menu
item and in a status-bar badge for as long as it serves, and a way to copy the URL."""

from __future__ import annotations

import socket

import pytest

pytestmark = pytest.mark.slow  # a real window and engine, on the bundled model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serving_shows_the_url_and_port_and_copies_it(make_window, qtbot, monkeypatch):
    from PySide6.QtGui import QGuiApplication

    port = _free_port()
    monkeypatch.setenv("KVSCOPE_SERVE_PORT", str(port))
    monkeypatch.delenv("KVSCOPE_API_KEY", raising=False)
    window = make_window()
    server = window.server
    assert not server.copy_action.isEnabled() and not server.badge.isVisible()
    server.action.trigger()
    qtbot.waitUntil(lambda: bool(server.url), timeout=30_000)
    url = f"http://127.0.0.1:{port}/v1"
    assert server.url == url and server.port == port
    assert url in server.action.text() and f"port {port}" in server.action.text()
    assert server.badge.isVisible() and server.badge.text() == f"Serving on port {port}"
    assert url in server.badge.toolTip()
    menus = [a.menu() for a in window.menuBar().actions() if a.menu() is not None]
    assert any(server.copy_action in menu.actions() for menu in menus)
    QGuiApplication.clipboard().clear()
    server.copy_action.trigger()
    assert QGuiApplication.clipboard().text() == url
    QGuiApplication.clipboard().clear()
    server.badge.click()
    assert QGuiApplication.clipboard().text() == url
    server.action.trigger()
    qtbot.waitUntil(lambda: not server.url, timeout=30_000)
    assert not server.badge.isVisible() and not server.copy_action.isEnabled()
    assert "Serve the engine" in server.action.text()
