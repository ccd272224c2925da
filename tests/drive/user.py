"""The drive's hands: clicks, typing, menus and file dialogs through Qt's test events.

Everything goes through QTest's mouse and key events on the real widgets, as a user's input
would (the menu bar is clicked, then the menu's item); waiting runs the event loop, so the
window keeps painting and the stall monitor keeps ticking while the drive waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from monitors import Activity
from PySide6.QtCore import QCoreApplication, QEvent, QEventLoop, Qt, QTimer
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QFileDialog, QLineEdit, QWidget


class DriveTimeout(Exception):
    """A wait the drive gave up on: the scenario fails, is recorded, and the drive goes on."""


def _run_events(ms: int) -> None:
    """Run the event loop for `ms`. Not QTest.qWait: PySide6 holds the GIL through it, so the
    engine's thread got ~1% of its time while the drive waited (the window took 100 s to load
    the model and replied at 0.6 tok/s instead of 2 s and ~90); QEventLoop.exec lets it go.

    The drive runs inside the application's loop and waits in nested ones, and Qt runs a
    deleteLater() only once control is back in the loop it was called from, which the drive's
    never is until it ends: every widget the window let go (a chat's bubbles on switching chats)
    would stay alive, growing RSS and every theme change. So the deletions a user's event loop
    would run are run here, as qWait does."""
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


def _plain(text: str) -> str:
    return text.replace("&", "").strip()


class User:
    def __init__(self, activity: Activity) -> None:
        self.activity = activity

    # ---- time ---------------------------------------------------------------------------
    def wait(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            _run_events(int(min(left, 0.05) * 1000) + 1)

    def wait_until(self, ready: Callable[[], object], timeout_s: float, what: str):
        """Runs the event loop until `ready()` is truthy; returns its value."""
        end = time.monotonic() + timeout_s
        while True:
            value = ready()
            if value:
                return value
            if time.monotonic() > end:
                raise DriveTimeout(f"{what}: not after {timeout_s:.0f} s")
            _run_events(50)

    # ---- mouse and keys -----------------------------------------------------------------
    def click(self, widget: QWidget, what: str = "") -> None:
        if not widget.isVisible() or not widget.isEnabled():
            raise DriveTimeout(f"cannot click {what or widget}: hidden or disabled")
        QTest.mouseMove(widget, widget.rect().center())
        QTest.mouseClick(widget, Qt.LeftButton, Qt.NoModifier, widget.rect().center())

    def key(self, widget: QWidget, key, modifier=Qt.NoModifier) -> None:
        QTest.keyClick(widget, key, modifier)

    def shortcut(self, window, key, modifier) -> None:
        """A window shortcut (Ctrl+,): the window is made active first, as a user's
        click on it would, since a closed dialog may have left no window active."""
        window.activateWindow()
        self.wait_until(lambda: QApplication.activeWindow() is window, 5, "the window active")
        QTest.keyClick(window.focusWidget() or window, key, modifier)

    def type_into(self, widget: QWidget, text: str, replace: bool = True) -> None:
        """Click the field, select what it holds (when replacing), type `text`."""
        self.click(widget)
        if replace:
            QTest.keyClick(widget, Qt.Key_A, Qt.ControlModifier)
            QTest.keyClick(widget, Qt.Key_Backspace)
        QTest.keyClicks(widget, text)

    # ---- menus and dialogs --------------------------------------------------------------
    def menu(self, window, *path: str) -> None:
        """Click the menu bar's `path[0]`, then each item down to the last (a submenu opens
        when its item is clicked). Matching ignores '&' accelerators."""
        bar = window.menuBar()
        action = next((a for a in bar.actions() if _plain(a.text()) == _plain(path[0])), None)
        if action is None:
            raise DriveTimeout(f"no menu {path[0]!r} in the menu bar")
        QTest.mouseClick(bar, Qt.LeftButton, Qt.NoModifier, bar.actionGeometry(action).center())
        menu = self.wait_until(lambda: action.menu().isVisible() and action.menu(), 5, path[0])
        for i, label in enumerate(path[1:], 1):
            item = next((a for a in menu.actions() if _plain(a.text()) == _plain(label)), None)
            if item is None:
                names = [_plain(a.text()) for a in menu.actions() if a.text()]
                raise DriveTimeout(f"no item {label!r} in menu {path[i - 1]!r}: {names}")
            centre = menu.actionGeometry(item).center()
            QTest.mouseMove(menu, centre)
            if item.menu() is not None:  # a submenu: hovering opens it after a short delay
                QTest.mouseClick(menu, Qt.LeftButton, Qt.NoModifier, centre)
                sub = item.menu()
                menu = self.wait_until(lambda s=sub: s.isVisible() and s, 5, label)
            else:
                self.wait(0.05)
                QTest.mouseClick(menu, Qt.LeftButton, Qt.NoModifier, centre)

    def answer_file_dialog(self, path: str, timeout_s: float = 20) -> dict:
        """Arms a poll that types `path` into the next file dialog and presses Enter: the app's
        QFileDialog.get*FileName runs its own event loop, so the answer must come from a timer.
        Returns a dict the poll fills in ("answered": True, or "error")."""
        state: dict = {}
        deadline = time.monotonic() + timeout_s

        def poll() -> None:
            dialog = next(
                (
                    w
                    for w in QApplication.topLevelWidgets()
                    if isinstance(w, QFileDialog) and w.isVisible()
                ),
                None,
            )
            if dialog is None:
                if time.monotonic() < deadline:
                    QTimer.singleShot(100, poll)
                else:
                    state["error"] = f"no file dialog appeared within {timeout_s:.0f} s"
                return
            name = dialog.findChild(QLineEdit, "fileNameEdit")
            state["directory"] = dialog.directory().absolutePath()
            if name is None:
                state["error"] = "the file dialog has no file name field"
                dialog.reject()
                return
            self.type_into(name, path)
            QTest.keyClick(name, Qt.Key_Return)
            state["answered"] = True

        QTimer.singleShot(200, poll)
        return state
