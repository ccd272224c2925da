"""The app's light and dark stylesheets, and which one applies: the user's choice (View menu)
or, for "system", the platform's colour scheme, followed live when it changes (Qt 6.5+).
What the style sheets cannot colour (plots, the block map, code) follows `changed` through
app/desktop/palette.py.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

from kvscope.app.core.paths import ASSETS_DIR
from kvscope.app.desktop.palette import Palette, current, set_current

STYLESHEETS = {"dark": "style.qss", "light": "style_light.qss"}
KEEPER_NAME = "themeKeeper"


def resolve_theme(choice: str, scheme: Qt.ColorScheme) -> str:
    """Light or dark: the choice itself, or for "system" the platform's scheme (dark when
    the platform does not say)."""
    if choice != "system":
        return choice
    return "light" if scheme == Qt.ColorScheme.Light else "dark"


def system_scheme() -> Qt.ColorScheme:
    return QGuiApplication.styleHints().colorScheme()


class ThemeKeeper(QObject):
    """Applies a theme choice to the application and re-applies "system" when the platform's
    scheme changes. One per application (theme_keeper()): the stylesheet is the app's."""

    changed = Signal(object)  # the Palette now shown, after a change of light or dark

    def __init__(self, parent: QObject) -> None:
        super().__init__(parent, objectName=KEEPER_NAME)
        self.choice = "system"
        self.shown = ""  # "light" or "dark" once applied
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._scheme_changed)

    def apply(self, choice: str) -> str:
        """Use `choice` (one of THEMES); returns the theme now shown, "light" or "dark"."""
        self.choice = choice
        before, self.shown = self.shown, resolve_theme(choice, system_scheme())
        palette = set_current(self.shown)
        sheet = (ASSETS_DIR / STYLESHEETS[self.shown]).read_text()
        app = QApplication.instance()
        assert isinstance(app, QApplication)  # the stylesheet and palette are a widget app's
        if app.styleSheet() != sheet:  # re-polishing every widget is not free
            app.setStyleSheet(sheet)
        colors = app.palette()
        if colors.color(QPalette.ColorRole.Link) != QColor(palette.link):
            colors.setColor(
                QPalette.ColorRole.Link, QColor(palette.link)
            )  # Qt's blue: unreadable on dark
            app.setPalette(colors)
        if self.shown != before:
            self.changed.emit(palette)
        return self.shown

    def _scheme_changed(self, _scheme: Qt.ColorScheme) -> None:
        if self.choice == "system":
            self.apply("system")


def theme_keeper() -> ThemeKeeper:
    """The application's ThemeKeeper, made on first use."""
    app = QApplication.instance()
    assert app is not None  # made by the widgets that follow the theme, so after the app
    keeper = app.findChild(ThemeKeeper, KEEPER_NAME)
    return keeper if keeper is not None else ThemeKeeper(app)


class _Follower(QObject):
    """Lives as a child of the widget it restyles, so the connection goes when the widget
    does (PySide drops a connection to a bound method of a deleted QObject)."""

    def __init__(self, owner: QObject, restyle: Callable[[Palette], None]) -> None:
        super().__init__(owner)
        self._restyle = restyle

    def apply(self, palette: Palette) -> None:
        # A closed pyqtgraph view has cleared its scene (its items' C++ side is gone) while the
        # widget waits for deletion: nothing is left to restyle.
        if getattr(self.parent(), "closed", False):
            return
        self._restyle(palette)


def follow_theme(owner: QObject, restyle: Callable[[Palette], None]) -> None:
    """Call `restyle(palette)` now and after every change of theme, for as long as `owner`
    lives."""
    restyle(current())
    theme_keeper().changed.connect(_Follower(owner, restyle).apply)
