"""How the Get a model window's labels look, in the current theme: captions muted, titles bold,
errors in the theme's error colour.

The application's style sheet has no rule for these labels; a label's own sheet, set here and
again on every change of theme (app/desktop/theme.py's follow_theme), gives them the palette's
colours (app/desktop/palette.py).
"""

from __future__ import annotations

from PySide6.QtWidgets import QLabel

from kvscope.app.desktop.palette import Palette, current
from kvscope.app.desktop.theme import follow_theme


def bold(label: QLabel) -> QLabel:
    font = label.font()
    font.setBold(True)
    label.setFont(font)
    return label


def muted(label: QLabel) -> QLabel:
    """A caption in the palette's muted colour (its error colour while `set_error` says so)."""
    follow_theme(label, lambda p: label.setStyleSheet(_sheet(label, p)))
    return label


def set_error(label: QLabel, error: bool) -> None:
    """Show a `muted` label's text as an error, or as a caption again."""
    label.setProperty("error", error)
    label.setStyleSheet(_sheet(label, current()))


def _sheet(label: QLabel, p: Palette) -> str:
    return f"color: {p.error if label.property('error') else p.muted};"
