"""CodeScroller: one code block's lines, wrapped to the bubble, laid over the block's place in a
message.

A message is one QTextDocument (links, search and copy see all of it), and its code lines are
one layout line each: a line longer than the bubble either widened the bubble or was cut off,
and a text cursor moving into it scrolled the whole message sideways. So the view lays this
over them: the same lines with their highlighting, in a view of the bubble's width that wraps a
long line under itself, indented (HANG_PX) so a continuation reads as one: a 75-character line
needs ~560 px, more than the ~375 px a 1400-px window's chat column leaves a block, so a block
that scrolled sideways would be the common case. The message reserves room under the block for
the rows wrapping adds; Copy still copies the lines as written.
"""

from __future__ import annotations

import math

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontMetricsF, QTextBlock, QTextBlockFormat, QTextCursor, QTextOption
from PySide6.QtWidgets import QFrame, QTextBrowser, QWidget

from kvscope.app.desktop.chat.markdown import SafeDocument

CODE_PADDING = 6  # left and right, as the message's code lines have it
HANG_PX = 16  # a wrapped line's continuation starts this far right of its line's start


class CodeScroller(QTextBrowser):
    """A read-only copy of one code block that wraps a line longer than its width."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.setObjectName("codeScroller")
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setDocument(SafeDocument(self))
        self.document().setDocumentMargin(0)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setLineWrapMode(QTextBrowser.LineWrapMode.WidgetWidth)
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._lines: tuple[str, ...] = ()
        self._background = ("", "")

    def set_colors(self, background: str, handle: str) -> None:
        """Opaque in the code colour: the message's own copy of the lines lies underneath."""
        if (background, handle) != self._background:
            self._background = (background, handle)
            self.setStyleSheet(
                f"QTextBrowser#codeScroller {{ background: {background}; border: none; }}"
                f" QScrollBar::handle:horizontal {{ background: {handle}; }}"
            )

    def set_lines(self, first: QTextBlock, last: QTextBlock, theme: str) -> None:
        """Copy the message's code lines first..last (formats and highlighting kept), as
        highlighted for `theme`."""
        lines, block = [], first
        while True:
            lines.append(block.text())
            if block == last:
                break
            block = block.next()
        key = (*lines, theme)
        if key == self._lines:
            return  # a streaming reply re-renders many times a second; its code rarely changes
        self._lines = key
        source = QTextCursor(first.document())
        source.setPosition(first.position())
        source.setPosition(last.position() + last.length() - 1, QTextCursor.MoveMode.KeepAnchor)
        document = self.document()
        document.clear()
        cursor = QTextCursor(document)
        cursor.insertFragment(source.selection())
        line = document.firstBlock()
        while line.isValid():
            # A line's first row at CODE_PADDING; its wrapped rows under its own indentation
            # and HANG_PX further, so none reads as a line of its own (in Python, another block).
            text = line.text()
            lead = text[: len(text) - len(text.lstrip(" \t"))].replace("\t", "    ")
            font = QTextCursor(line).charFormat().font()
            indent = QFontMetricsF(font).horizontalAdvance(lead) + HANG_PX
            fmt = QTextBlockFormat()
            fmt.setLeftMargin(CODE_PADDING + indent)
            fmt.setTextIndent(-indent)
            fmt.setRightMargin(CODE_PADDING)
            QTextCursor(line).setBlockFormat(fmt)
            line = line.next()

    def needed_height(self, width: int) -> int:
        """Its lines' height wrapped at `width` (the view wraps them at its own width, this)."""
        self.document().setTextWidth(width)
        return math.ceil(self.document().size().height())
