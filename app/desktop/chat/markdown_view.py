"""MarkdownView: one message's text as rendered markdown, and what a click on a link may do.

The text is untrusted, so the view loads no resource (see app.desktop.chat.markdown) and a link
opens only through `open_link`: http(s) only, and only after the user says yes. Each code block
has a Copy button on its header line that puts the code, as written, on the clipboard, and its
lines under a CodeScroller (app/desktop/chat/code_scroller.py): a line longer than the bubble
wraps inside its block. The message itself never scrolls sideways: it is as wide as its bubble.
"""

from __future__ import annotations

import math

from PySide6.QtCore import Qt, QTimer, QUrl
from PySide6.QtGui import QDesktopServices, QGuiApplication, QTextBlock, QTextCursor
from PySide6.QtWidgets import (
    QFrame,
    QMessageBox,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QWidget,
)

from kvscope.app.desktop.chat.code_blocks import CODE_LANGUAGE, CodeBlock, code_blocks
from kvscope.app.desktop.chat.code_scroller import CodeScroller
from kvscope.app.desktop.chat.markdown import SafeDocument, render_markdown
from kvscope.app.desktop.palette import Palette, current
from kvscope.app.desktop.theme import follow_theme

LINK_SCHEMES = ("http", "https")


def open_link(url: QUrl) -> bool:
    """Open an http(s) link in the browser once the user agrees; anything else is refused.
    Returns whether it was opened."""
    scheme = url.scheme().lower()
    shown = url.toString()
    if scheme not in LINK_SCHEMES:
        QMessageBox.information(
            None,
            "Link not opened",
            f"KVScope opens only http and https links from chats.\n\n{shown}",
        )
        return False
    answer = QMessageBox.question(None, "Open link?", f"Open this link in your browser?\n\n{shown}")
    if answer != QMessageBox.StandardButton.Yes:
        return False
    return QDesktopServices.openUrl(url)


class MarkdownView(QTextBrowser):
    """A read-only markdown block as tall as its text: the scroll area around it scrolls."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        # A click never navigates the bubble (a file:// link would replace it with the file) and
        # never goes straight to the OS: `open_link` asks first, and only for http(s).
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(open_link)
        self.setDocument(SafeDocument(self))
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.document().setDocumentMargin(2)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        # Code lines do not wrap, so the document may be wider than the bubble: a cursor or a
        # selection moving into one would scroll the whole message sideways. It never scrolls.
        self.horizontalScrollBar().rangeChanged.connect(self._no_sideways_scroll)
        self._markdown = ""
        self._copy_buttons: list[CopyCodeButton] = []
        self._scrollers: list[CodeScroller] = []
        self._placing = False
        follow_theme(self, self._restyle)

    def set_markdown(self, text: str) -> None:
        if text != self._markdown:
            self._markdown = text
            render_markdown(self.document(), text)
            self._update_copy_buttons()

    def _restyle(self, _palette: Palette) -> None:
        """Code colours are baked into the document when it renders: render it again."""
        if self._markdown:
            render_markdown(self.document(), self._markdown)
            self._update_copy_buttons()

    def copy_buttons(self) -> list[CopyCodeButton]:
        """One per code block, in order."""
        return list(self._copy_buttons)

    def code_scrollers(self) -> list[CodeScroller]:
        """One per code block, in order: its lines, wrapped where too long."""
        return list(self._scrollers)

    def markdown(self) -> str:
        return self._markdown

    def loadResource(self, kind: int, url: QUrl | str) -> None:  # noqa: N802 (Qt's name)
        """Chat content loads nothing: no file, no network, whatever the markdown says."""
        return None

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._place_copy_buttons()

    def _fit(self, size) -> None:
        self.setFixedHeight(math.ceil(size.height()) + 2 * self.frameWidth())
        self._place_copy_buttons()

    def _no_sideways_scroll(self, _low: int, high: int) -> None:
        if high:
            self.horizontalScrollBar().setRange(0, 0)

    def _update_copy_buttons(self) -> None:
        """Buttons and scrollers are kept across renders (a streaming reply re-renders many
        times a second)."""
        blocks = code_blocks(self.document(), self._markdown)
        while len(self._copy_buttons) > len(blocks):
            self._copy_buttons.pop().deleteLater()
            self._scrollers.pop().deleteLater()
        while len(self._copy_buttons) < len(blocks):
            scroller = CodeScroller(self.viewport())
            scroller.show()
            self._scrollers.append(scroller)
            button = CopyCodeButton(self.viewport())
            button.show()
            self._copy_buttons.append(button)
        for button, scroller, block in zip(
            self._copy_buttons, self._scrollers, blocks, strict=True
        ):
            button.code = block.code
            palette = current()
            scroller.set_colors(palette.code_background, palette.scroll_handle)
            scroller.set_lines(*_code_lines(block), palette.name)
        self._place_copy_buttons()

    def _place_copy_buttons(self) -> None:
        """Each Copy button on its block's header, each scroller over its block's lines, the
        room their wrapping needs reserved under them."""
        if self._placing:
            return  # reserving room relays the document out, which calls this again
        self._placing = True
        try:
            self._place(code_blocks(self.document(), self._markdown))
        finally:
            self._placing = False

    def _place(self, blocks: list[CodeBlock]) -> None:
        layout = self.document().documentLayout()
        margin = int(self.document().documentMargin())
        width = max(1, self.viewport().width() - 2 * margin)
        for button, scroller, block in zip(
            self._copy_buttons, self._scrollers, blocks, strict=False
        ):
            rect = layout.blockBoundingRect(block.header)
            button.setFixedHeight(max(14, int(rect.height())))
            x = int(rect.right()) - button.width() - 2
            button.move(max(0, x), int(rect.top()))
            first, last = _code_lines(block)
            top = layout.blockBoundingRect(first).top()
            lines = _lines_height(first, last)
            needed = scroller.needed_height(width)
            _reserve(last, max(0, needed - lines))
            # Out to the viewport's edge (its lines wrap short of it): the message's own,
            # unwrapped lines run on under it and would show in the document's margin.
            scroller.setViewportMargins(0, 0, margin, 0)
            scroller.setGeometry(margin, math.floor(top), width + margin, needed)
            scroller.raise_()
            button.raise_()


CODE_BOTTOM_MARGIN = 6  # under a code block's last line (app/desktop/chat/code_blocks.py)


def _code_lines(block: CodeBlock) -> tuple[QTextBlock, QTextBlock]:
    """The first and last line of a headed code block in its document."""
    first = last = block.header.next()
    while last.next().isValid() and last.next().blockFormat().property(CODE_LANGUAGE) == (
        block.language
    ):
        last = last.next()
    return first, last


def _lines_height(first: QTextBlock, last: QTextBlock) -> float:
    """From the first line's top to the last line's bottom, without the last one's margin."""
    bottom = last.layout().position().y() + last.layout().boundingRect().height()
    return bottom - first.layout().position().y()


def _reserve(last: QTextBlock, extra: float) -> None:
    """Room under a code block's last line for what its scroller needs beyond the lines."""
    wanted = CODE_BOTTOM_MARGIN + extra
    fmt = last.blockFormat()
    if int(fmt.bottomMargin()) != wanted:
        fmt.setBottomMargin(wanted)
        cursor = QTextCursor(last)
        cursor.setBlockFormat(fmt)


class CopyCodeButton(QToolButton):
    """Copies one code block's text; says "Copied" for a moment after."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.setText("Copy")
        self.setObjectName("bubbleAction")
        self.setToolTip("Copy this code")
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.code = ""
        self.setText("Copied")  # the wider label: the button never changes width
        self.setFixedWidth(self.sizeHint().width())
        self.setText("Copy")
        self._reset = QTimer(self, singleShot=True, interval=1500)
        self._reset.timeout.connect(lambda: self.setText("Copy"))
        self.clicked.connect(self._copy)

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.code)
        self.setText("Copied")
        self._reset.start()
