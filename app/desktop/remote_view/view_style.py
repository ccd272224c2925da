"""The remote view's stylesheet: its own, in the theme's colours (app/desktop/palette.py).

The view's own sheet wins over the application's rules for every widget inside, so it is
re-set whenever the theme changes (`style_view`)."""

from __future__ import annotations

from PySide6.QtWidgets import QWidget

from kvscope.app.desktop.palette import DARK, Palette
from kvscope.app.desktop.theme import follow_theme


def view_style(p: Palette) -> str:
    tip_background, tip_text, tip_border = p.tooltip
    return (
        f"QWidget {{ background: {p.ground}; color: {p.text}; }}"
        f" QSplitter::handle {{ background: {p.handle}; }}"
        f" QTextBrowser {{ background: {p.surface}; border: 1px solid {p.border};"
        f" color: {p.text}; font-size: 11px; }}"
        f" QLineEdit {{ background: {p.surface}; border: 1px solid {p.border};"
        f" border-radius: 6px; padding: 4px 6px; color: {p.button_text}; }}"
        f" QLineEdit:focus {{ border: 1px solid {p.accent}; }}"
        f" QPushButton, QToolButton {{ background: {p.button}; border: 1px solid"
        f" {p.button_border}; border-radius: 6px; padding: 5px 12px; color: {p.button_text}; }}"
        f" QPushButton:hover, QToolButton:hover {{ background: {p.button_hover}; }}"
        f" QPushButton:disabled, QToolButton:disabled {{ color: {p.disabled}; }}"
        f" QTabBar::tab {{ background: {p.scroll}; color: {p.muted}; padding: 4px 12px;"
        f" border: 1px solid {p.border}; border-bottom: none; }}"
        f" QTabBar::tab:selected {{ background: {p.surface}; color: {p.strong}; }}"
        f" QToolTip {{ background: {tip_background}; color: {tip_text};"
        f" border: 1px solid {tip_border}; }}"
    )


VIEW_STYLE = view_style(DARK)  # the dark theme's


def style_view(view: QWidget) -> None:
    """Give the view its sheet in the theme on show, and again after every change."""
    follow_theme(view, lambda palette: view.setStyleSheet(view_style(palette)))
