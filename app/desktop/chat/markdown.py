"""Markdown into a QTextDocument (Qt's own CommonMark/GFM parser), with code set apart.

Chat text is untrusted (a model can be made to write anything), so rendering never reaches for
a resource: raw HTML is shown as the text it is (`MarkdownNoHTML`), every image is replaced by
its alt text before the document is laid out, and the document itself (`SafeDocument`) refuses
every resource load, so no path or URL in a message is ever opened (QTextDocument's own
loadResource would otherwise read any local path it is given, /dev/zero included). Links stay
links; what a click does is `MarkdownView`'s policy.

A single newline inside a paragraph breaks the line, as chat UIs do (a poem keeps its lines),
where CommonMark would join the lines: see `keep_line_breaks`.
"""

from __future__ import annotations

import functools
import re

from PySide6.QtGui import (
    QColor,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextDocumentFragment,
    QTextFormat,
)

from kvscope.app.desktop.chat.code_blocks import (
    CODE_FAMILIES,
    format_code_blocks,
    is_code_block,
    scan_fences,
)
from kvscope.app.desktop.palette import DARK, current

INLINE_CODE_BACKGROUND = QColor(DARK.inline_code)  # the dark theme's; current() at render


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
    scratch = _parse(keep_line_breaks(text))
    _break_marked_lines(scratch)
    _images_to_text(scratch)
    _mark_inline_code(scratch)
    format_code_blocks(scratch)
    document.clear()
    QTextCursor(document).insertFragment(QTextDocumentFragment(scratch))


@functools.lru_cache(maxsize=1024)  # the chat list redraws every title on each change
def plain_text(text: str) -> str:
    """Markdown as the words a reader sees, on one line: for titles and labels."""
    document = _parse(text)
    _images_to_text(document)
    return " ".join(document.toPlainText().split())


def _parse(text: str) -> SafeDocument:
    document = SafeDocument()
    document.setMarkdown(text, MARKDOWN_FEATURES)
    return document


# ---- single newlines ----------------------------------------------------------------------
# A private-use mark ends each line whose newline should break: the parser turns that newline
# into a space, and the mark followed by that space becomes a line separator (a break inside
# the paragraph, list item or quote). A mark left without a space (the line ended its block)
# is dropped. Lines whose kind a trailing character would change get no mark.
LINE_BREAK_MARK = "\ue000"
LINE_SEPARATOR = "\u2028"
_KEEP_AS_IS = re.compile(
    r"^\s*$"  # blank
    r"|\\$"  # already a hard break
    r"|^\s*[=\-*_ ]+$"  # setext underline, thematic break
    r"|^\s*([-+*]|\d+[.)])\s*$"  # a list marker alone
    r"|^\s*>[\s>]*$"  # an empty quote line
    r"|^\s{0,3}\[[^\]]+\]:"  # a link reference definition
    r"|\|"  # a table row
)


def keep_line_breaks(text: str) -> str:
    """Mark each newline inside a paragraph (outside code fences) to render as a line break."""
    lines = text.split("\n")
    in_fence: set[int] = set()
    for fence in scan_fences(text):
        in_fence.update(range(fence.first, fence.last + 1))
    for i, line in enumerate(lines[:-1]):
        if i in in_fence or i + 1 in in_fence or not lines[i + 1].strip():
            continue
        if not _KEEP_AS_IS.search(line):
            lines[i] = line + LINE_BREAK_MARK
    return "\n".join(lines)


def _break_marked_lines(document: QTextDocument) -> None:
    for marked, replacement in ((LINE_BREAK_MARK + " ", LINE_SEPARATOR), (LINE_BREAK_MARK, "")):
        cursor = document.find(marked)
        while not cursor.isNull():
            cursor.insertText(replacement)
            cursor = document.find(marked, cursor)


# ---- inline code and images -----------------------------------------------------------------
def _is_code(char_format) -> bool:
    return char_format.fontFixedPitch() or "monospace" in (char_format.fontFamilies() or [])


def _mark_inline_code(document: QTextDocument) -> None:
    cursor = QTextCursor(document)
    block = document.begin()
    while block.isValid():
        it = block.begin()
        while not is_code_block(block) and not it.atEnd():
            fragment = it.fragment()
            if fragment.isValid() and _is_code(fragment.charFormat()):
                cursor.setPosition(fragment.position())
                cursor.setPosition(
                    fragment.position() + fragment.length(), QTextCursor.MoveMode.KeepAnchor
                )
                char = fragment.charFormat()
                char.setBackground(QColor(current().inline_code))
                char.setFontFamilies(CODE_FAMILIES)
                cursor.setCharFormat(char)
            it += 1
        block = block.next()


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
        cursor.setPosition(position + length, QTextCursor.MoveMode.KeepAnchor)
        text_format = QTextCharFormat()
        text_format.setForeground(IMAGE_COLOR)
        text_format.setFontItalic(True)
        source = image.name()
        if source:
            text_format.setAnchor(True)
            text_format.setAnchorHref(source)
            text_format.setToolTip(source)
        cursor.insertText(f"[image: {alt or 'no description'}]", text_format)
