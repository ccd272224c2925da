"""Markdown into a QTextDocument (Qt's own CommonMark/GFM parser), with code set apart."""

from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QTextCursor, QTextDocument, QTextFormat

CODE_BACKGROUND = QColor("#0d1117")
INLINE_CODE_BACKGROUND = QColor("#2a3140")
CODE_FAMILIES = ["DejaVu Sans Mono", "Menlo", "Consolas", "monospace"]


def render_markdown(document: QTextDocument, text: str) -> None:
    """Replace the document with `text` as markdown; fenced and inline code in monospace."""
    document.setMarkdown(text, QTextDocument.MarkdownDialectGitHub)
    cursor = QTextCursor(document)
    block = document.begin()
    while block.isValid():
        fmt = block.blockFormat()
        if fmt.hasProperty(QTextFormat.BlockCodeFence) or _is_code(block.charFormat()):
            fmt.setBackground(CODE_BACKGROUND)
            fmt.setLeftMargin(6)
            fmt.setRightMargin(6)
            cursor.setPosition(block.position())
            cursor.setBlockFormat(fmt)
            cursor.setPosition(block.position() + block.length() - 1, QTextCursor.KeepAnchor)
            char = cursor.charFormat()
            char.setFontFamilies(CODE_FAMILIES)
            char.setFontStyleHint(QFont.Monospace)
            cursor.mergeCharFormat(char)
        else:
            _mark_inline_code(block, cursor)
        block = block.next()


def _is_code(char_format) -> bool:
    return char_format.fontFixedPitch() or "monospace" in (char_format.fontFamilies() or [])


def _mark_inline_code(block, cursor: QTextCursor) -> None:
    it = block.begin()
    while not it.atEnd():
        fragment = it.fragment()
        if fragment.isValid() and _is_code(fragment.charFormat()):
            cursor.setPosition(fragment.position())
            cursor.setPosition(fragment.position() + fragment.length(), QTextCursor.KeepAnchor)
            char = fragment.charFormat()
            char.setBackground(INLINE_CODE_BACKGROUND)
            char.setFontFamilies(CODE_FAMILIES)
            cursor.setCharFormat(char)
        it += 1
