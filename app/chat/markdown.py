"""Markdown into a QTextDocument (Qt's own CommonMark/GFM parser), with code set apart.

Chat text is untrusted (a model can be made to write anything), so rendering never reaches for
a resource: raw HTML is shown as the text it is (`MarkdownNoHTML`), every image is replaced by
its alt text before the document is laid out, and the document itself (`SafeDocument`) refuses
every resource load, so no path or URL in a message is ever opened (QTextDocument's own
loadResource would otherwise read any local path it is given, /dev/zero included). Links stay
links; what a click does is `MarkdownView`'s policy.
"""

from __future__ import annotations

from PySide6.QtGui import (
    QColor,
    QFont,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextDocumentFragment,
    QTextFormat,
)

CODE_BACKGROUND = QColor("#0d1117")
INLINE_CODE_BACKGROUND = QColor("#2a3140")
CODE_FAMILIES = ["DejaVu Sans Mono", "Menlo", "Consolas", "monospace"]


class SafeDocument(QTextDocument):
    """A QTextDocument that never loads a resource: no file, no network, no cache fill."""

    def loadResource(self, kind: int, url):  # noqa: N802 (Qt's name)
        return None


MARKDOWN_FEATURES = (
    QTextDocument.MarkdownFeature.MarkdownDialectGitHub
    | QTextDocument.MarkdownFeature.MarkdownNoHTML
)
IMAGE_COLOR = QColor("#8b949e")


def render_markdown(document: QTextDocument, text: str) -> None:
    """Replace the document with `text` as markdown; fenced and inline code in monospace.

    The markdown is parsed into a scratch document that has no layout: laying out an image
    loads it (Qt's image handler reads the file itself when no resource is supplied), and a
    view's document lays out as soon as its contents change. Only the image-free result is
    copied into `document`."""
    scratch = SafeDocument()
    scratch.setMarkdown(text, MARKDOWN_FEATURES)
    _images_to_text(scratch)
    _format_code(scratch)
    document.clear()
    QTextCursor(document).insertFragment(QTextDocumentFragment(scratch))


def _format_code(document: QTextDocument) -> None:
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


def _images_to_text(document: QTextDocument) -> None:
    """Every image becomes "[image: alt]", a link to its source (which the view's link policy
    governs), so the document holds no image for the layout to load."""
    images = []
    block = document.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            fmt = fragment.charFormat()
            if fragment.isValid() and fmt.isImageFormat():
                alt = fmt.property(QTextFormat.Property.ImageAltText) or ""
                images.append((fragment.position(), fragment.length(), alt, fmt.toImageFormat()))
            it += 1
        block = block.next()
    cursor = QTextCursor(document)
    for position, length, alt, image in reversed(images):  # back to front: positions hold
        cursor.setPosition(position)
        cursor.setPosition(position + length, QTextCursor.KeepAnchor)
        text_format = QTextCharFormat()
        text_format.setForeground(IMAGE_COLOR)
        text_format.setFontItalic(True)
        source = image.name()
        if source:
            text_format.setAnchor(True)
            text_format.setAnchorHref(source)
            text_format.setToolTip(source)
        cursor.insertText(f"[image: {alt or 'no description'}]", text_format)
