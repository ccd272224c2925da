"""HoverCard: the block map's hover card, a tooltip window of its own placed at the pointer.

A top-level window, not a child label: a child would be clipped by the map's edges. It is
placed below right of the pointer and flipped to the pointer's other side where the screen
ends, so it always lies inside the screen.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QLabel, QWidget

from kvscope.app.desktop.palette import Palette


def hover_style(p: Palette) -> str:
    background, text, border = p.card
    return (
        f"QLabel {{ background: {background}; color: {text}; border: 1px solid {border};"
        " border-radius: 4px; padding: 6px 8px; }"
    )


class HoverCard(QLabel):
    def __init__(self, owner: QWidget) -> None:
        super().__init__(owner, Qt.WindowType.ToolTip)
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setWordWrap(True)
        self.setMaximumWidth(380)
        self.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
        self.hide()

    def place(self, pointer: QPoint) -> None:
        """Near `pointer` (global pixels), inside the screen."""
        size = self.size()
        screen = self.screen().availableGeometry()
        x, y = pointer.x() + 16, pointer.y() + 16
        if x + size.width() > screen.right():
            x = pointer.x() - size.width() - 12
        if y + size.height() > screen.bottom():
            y = pointer.y() - size.height() - 12
        x = min(max(x, screen.left()), screen.right() - size.width())
        y = min(max(y, screen.top()), screen.bottom() - size.height())
        self.move(x, y)
