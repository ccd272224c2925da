"""HeaderFlow: a bubble's header line that wraps instead of widening the bubble.

A bubble's header holds who wrote it and its status on the left, and its actions (the sample
switcher, Copy, Edit, Regenerate, and whatever joins them) on the right. In one row they need
~370 px, more than the chat column has in a 1024 px window, and a bubble as wide as its header
was cut off on the right. Here the actions stay on the first line, right-aligned, while they fit
beside the lead; past that they flow onto the lines below, still right-aligned. The least width
is the widest single item's, so the header never sets the chat column's width.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import QLayout, QLayoutItem, QWidget, QWidgetItem

LEAD, TRAIL = 0, 1


class HeaderFlow(QLayout):
    def __init__(self, parent: QWidget | None = None, spacing: int = 6) -> None:
        super().__init__(parent)
        self._items: list[tuple[QLayoutItem, int]] = []  # (item, LEAD or TRAIL)
        self._spacing = spacing
        self.setContentsMargins(0, 0, 0, 0)

    # ---- what the bubble puts in --------------------------------------------------------
    def add_lead(self, widget: QWidget) -> None:
        """Left-aligned at the start of the first line (who wrote it, the status)."""
        self._add(widget, LEAD)

    def add_trail(self, widget: QWidget) -> None:
        """Right-aligned after the lead, wrapping onto the next line when it does not fit."""
        self._add(widget, TRAIL)

    def _add(self, widget: QWidget, side: int) -> None:
        self.addChildWidget(widget)
        self._items.append((QWidgetItem(widget), side))
        self.invalidate()

    # ---- QLayout ------------------------------------------------------------------------
    def addItem(self, item: QLayoutItem) -> None:  # noqa: N802 (Qt's name)
        self._items.append((item, TRAIL))

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:  # noqa: N802 (Qt's name)
        return self._items[index][0] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:  # noqa: N802 (Qt's name)
        return self._items.pop(index)[0] if 0 <= index < len(self._items) else None

    def expandingDirections(self) -> Qt.Orientation:  # noqa: N802 (Qt's name)
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:  # noqa: N802 (Qt's name)
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802 (Qt's name)
        return self._arrange(QRect(0, 0, width, 0), move=False)

    def setGeometry(self, rect: QRect) -> None:  # noqa: N802 (Qt's name)
        super().setGeometry(rect)
        self._arrange(rect, move=True)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        shown = self._shown()
        width = sum(item.sizeHint().width() for item, _side in shown)
        width += self._spacing * max(0, len(shown) - 1)
        height = max((item.sizeHint().height() for item, _side in shown), default=0)
        margins = self.contentsMargins()
        return QSize(
            width + margins.left() + margins.right(), height + margins.top() + margins.bottom()
        )

    def minimumSize(self) -> QSize:  # noqa: N802 (Qt's name)
        shown = self._shown()
        width = max((item.minimumSize().width() for item, _side in shown), default=0)
        margins = self.contentsMargins()
        return QSize(width + margins.left() + margins.right(), self.heightForWidth(width))

    # ---- arranging ----------------------------------------------------------------------
    def _shown(self) -> list[tuple[QLayoutItem, int]]:
        return [(item, side) for item, side in self._items if not item.isEmpty()]

    def _arrange(self, rect: QRect, move: bool) -> int:
        """Lay the items out in `rect` (when `move`); returns the height they take."""
        margins = self.contentsMargins()
        area = rect.adjusted(margins.left(), margins.top(), -margins.right(), -margins.bottom())
        shown = self._shown()
        lead = [item for item, side in shown if side == LEAD]
        trail = [item for item, side in shown if side == TRAIL]
        lines: list[tuple[list[QLayoutItem], list[QLayoutItem]]] = [([], [])]
        used = 0
        for item in lead:  # the lead wraps too, should the column be narrower than it
            w = item.sizeHint().width()
            if lines[-1][0] and used + self._spacing + w > area.width():
                lines.append(([], []))
                used = 0
            used += (self._spacing if lines[-1][0] else 0) + w
            lines[-1][0].append(item)
        for item in trail:
            w = item.sizeHint().width()
            gap = self._spacing if lines[-1][0] or lines[-1][1] else 0
            if (lines[-1][0] or lines[-1][1]) and used + gap + w > area.width():
                lines.append(([], []))
                used, gap = 0, 0
            used += gap + w
            lines[-1][1].append(item)
        y = area.y()
        for left, right in lines:
            height = max((i.sizeHint().height() for i in left + right), default=0)
            if move:
                x = area.x()
                for item in left:
                    x = self._place(item, x, y, height) + self._spacing
                widths = sum(i.sizeHint().width() for i in right) + self._spacing * (len(right) - 1)
                x = max(x, area.right() + 1 - widths)
                for item in right:
                    x = self._place(item, x, y, height) + self._spacing
            y += height + self._spacing
        return y - self._spacing - area.y() + margins.top() + margins.bottom() if shown else 0

    @staticmethod
    def _place(item: QLayoutItem, x: int, y: int, line_height: int) -> int:
        size = item.sizeHint()
        top = y + (line_height - size.height()) // 2
        item.setGeometry(QRect(QPoint(x, top), size))
        return x + size.width()
