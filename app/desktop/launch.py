"""The desktop app's start: the QApplication, its icon, then the window or the scripted demo.

Apart from window.py so that the demo, which builds a MainWindow, and the window do not import
each other; the command line calls `run_window` here.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from kvscope.app.core.paths import ASSETS_DIR
from kvscope.app.desktop.window import MainWindow
from kvscope.app.remote.connection import Connection


def set_app_icon(app: QApplication) -> None:
    """The app icon; each window applies its theme (app/desktop/theme.py)."""
    icon = ASSETS_DIR / "kvscope.png"
    if icon.is_file():  # drawn by packaging/make_icons.py
        app.setWindowIcon(QIcon(str(icon)))


def run_window(
    demo: int | None = None, screenshot: str | None = None, connections: Sequence[Connection] = ()
) -> int:
    app = QApplication.instance() or QApplication([])
    assert isinstance(app, QApplication)  # the window needs a widget app, not a core one
    app.setApplicationName("KVScope")
    set_app_icon(app)
    if demo:
        from kvscope.app.desktop.demo import run_demo

        return run_demo(app, demo, screenshot)
    window = MainWindow(connections=connections)
    window.show()
    if screenshot:  # a picture of the window with the model loaded, then exit

        def grab(_info) -> None:
            app.exit(0 if window.grab().save(screenshot) else 1)
            window.close()

        window.engine_ready.connect(grab)
        window.engine_failed.connect(lambda _message: (window.close(), app.exit(1)))
    return app.exec()
