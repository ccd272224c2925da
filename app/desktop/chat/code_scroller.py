"""CodeScroller: one code block's lines, unwrapped, laid over the block's place in a message.

A message is one QTextDocument (links, search and copy see all of it), and a document cannot
scroll a part of itself: a code line longer than the bubble either widened the bubble or was
cut off, and a text cursor moving into it scrolled the whole message sideways. So the message
keeps its code lines (one layout line each) and the view lays a scroller over them: the same
lines with their highlighting, in a view of the bubble's width that scrolls sideways itself.
The message reserves room under the block for the scroller's scroll bar when it shows one.
"""

from __future__ import annotations

import math

from PySide6.QtCore import Qt
from PySide6.QtGui import QTextBlock, QTextBlockFormat, QTextCursor
from PySide6.QtWidgets import QFrame, QTextBrowser, QWidget

from kvscope.app.desktop.chat.markdown import SafeDocument

CODE_PADDING = 6  # left and right, as the message's code lines have it


class CodeScroller(QTextBrowser):
    """A read-only, unwrapped copy of one code block that scrolls sideways when it is wider."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.setObjectName("codeScroller")
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setDocument(SafeDocument(self))
        self.document().setDocumentMargin(0)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setLineWrapMode(QTextBrowser.LineWrapMode.NoWrap)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
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
        fmt = QTextBlockFormat()
        fmt.setLeftMargin(CODE_PADDING)
        fmt.setRightMargin(CODE_PADDING)
        fmt.setNonBreakableLines(True)
        cursor.select(QTextCursor.SelectionType.Document)
        cursor.setBlockFormat(fmt)

    def content_width(self) -> float:
        return self.document().idealWidth()

    def needed_height(self, width: int) -> int:
        """Its lines' height, plus the scroll bar's when `width` cannot show the longest line."""
        height = math.ceil(self.document().size().height())
        if self.content_width() > width:
            height += self.horizontalScrollBar().sizeHint().height()
        return height
