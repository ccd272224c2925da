"""Code blocks in a rendered message: set apart, highlighted, headed for a Copy button.

`format_code_blocks` runs on the freshly parsed markdown: each code block (a run of code lines
of one language) gets the code background and font, colours from `code_highlight`, and a
header block above it naming the language. The header carries a property the markdown itself
cannot set, so `code_blocks` finds exactly these blocks again in the view's document, where the
view lays a Copy button over each header. The parser turns tabs into spaces, so the code a
button copies is taken from the markdown source (`scan_fences`) where the two agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from PySide6.QtGui import (
    QColor,
    QFont,
    QTextBlock,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
)

from kvscope.app.desktop.chat.code_highlight import highlight
from kvscope.app.desktop.palette import DARK, Palette, current

CODE_FAMILIES = ["DejaVu Sans Mono", "Menlo", "Consolas", "monospace"]
# The dark theme's colours (app/desktop/palette.py has both themes'); a message takes the
# colours of the theme on show when it renders, and renders again when the theme changes.
CODE_BACKGROUND = QColor(DARK.code_background)
HEADER_BACKGROUND = QColor(DARK.code_header)
HEADER_COLOR = QColor(DARK.code_header_text)
KIND_COLORS = {kind: QColor(color) for kind, color in DARK.code_kinds.items()}


def kind_colors(palette: Palette | None = None) -> dict[str, QColor]:
    """Highlight colour by token kind, in `palette` (the theme on show by default)."""
    return {kind: QColor(color) for kind, color in (palette or current()).code_kinds.items()}


# Block properties that markdown cannot produce: they mark what this module made.
CODE_LANGUAGE = QTextFormat.Property.UserProperty + 1
CODE_HEADER = QTextFormat.Property.UserProperty + 2


@dataclass(frozen=True)
class CodeBlock:
    header: QTextBlock  # the block the Copy button sits on
    language: str
    code: str  # the text as written, lines joined by "\n"


def is_code_block(block: QTextBlock) -> bool:
    """A line of a fenced or indented code block as Qt's markdown parser leaves it."""
    char_format = block.charFormat()
    return block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence) or (
        char_format.fontFixedPitch() or "monospace" in (char_format.fontFamilies() or [])
    )


def format_code_blocks(document: QTextDocument) -> None:
    """Style, highlight and head every code block of a freshly parsed markdown document."""
    runs = _code_runs(document)
    cursor = QTextCursor(document)
    palette = current()
    for first, last, language in reversed(runs):  # back to front: earlier positions hold
        _style_lines(cursor, first, last, language, palette)
        _colour(cursor, first.position(), _text_of(first, last), language, palette)
        _insert_header(cursor, first, language, palette)


@dataclass(frozen=True)
class Fence:
    first: int  # line index of the opening fence
    last: int  # line index of the closing fence (the last line while it is still open)
    code: str  # the lines between, as written


_FENCE = re.compile(r"^([ \t]*)(`{3,}|~{3,})")


def scan_fences(text: str) -> list[Fence]:
    """The fenced code blocks of a markdown text, in order, by CommonMark's fence rules."""
    lines = text.split("\n")
    fences, i = [], 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if opened is None or (opened.group(2)[0] == "`" and "`" in lines[i][opened.end() :]):
            i += 1  # not a fence (a backtick fence's info string holds no backtick)
            continue
        indent, mark = len(opened.group(1)), opened.group(2)
        j = i + 1
        while j < len(lines) and not _closes(lines[j], mark):
            j += 1
        code = "\n".join(_dedent(line, indent) for line in lines[i + 1 : j])
        fences.append(Fence(i, min(j, len(lines) - 1), code))
        i = j + 1
    return fences


def _closes(line: str, mark: str) -> bool:
    stripped = line.strip()
    return len(stripped) >= len(mark) and set(stripped) == {mark[0]}


def _dedent(line: str, indent: int) -> str:
    """A fence's content loses as many leading spaces as the fence was indented, at most."""
    spaces = len(line) - len(line.lstrip(" "))
    return line[min(spaces, indent) :]


def code_blocks(document: QTextDocument, source: str = "") -> list[CodeBlock]:
    """The headed code blocks of a document that `format_code_blocks` prepared, in order; the
    code of each is its fence's text in `source` (the markdown) when that is what was parsed."""
    written = [fence.code for fence in scan_fences(source)]
    found = []
    block = document.begin()
    while block.isValid():
        if block.blockFormat().hasProperty(CODE_HEADER):
            header, language, lines = block, block.blockFormat().property(CODE_HEADER), []
            block = block.next()
            while block.isValid() and block.blockFormat().property(CODE_LANGUAGE) == language:
                lines.append(block.text())
                block = block.next()
            parsed = "\n".join(lines)
            match = next((k for k, w in enumerate(written) if _same_code(w, parsed)), None)
            if match is not None:
                parsed, written = written[match], written[match + 1 :]
            found.append(CodeBlock(header, language, parsed))
            continue
        block = block.next()
    return found


def _same_code(written: str, parsed: str) -> bool:
    return written.expandtabs(4) == parsed.expandtabs(4)


def _code_runs(document: QTextDocument) -> list[tuple[QTextBlock, QTextBlock, str]]:
    runs: list[tuple[QTextBlock, QTextBlock, str]] = []
    block = document.begin()
    while block.isValid():
        if is_code_block(block):
            language = block.blockFormat().property(QTextFormat.Property.BlockCodeLanguage) or ""
            if runs and runs[-1][1].next() == block and runs[-1][2] == language:
                runs[-1] = (runs[-1][0], block, language)
            else:
                runs.append((block, block, language))
        block = block.next()
    return runs


def _text_of(first: QTextBlock, last: QTextBlock) -> str:
    lines, block = [first.text()], first
    while block != last:
        block = block.next()
        lines.append(block.text())
    return "\n".join(lines)


def _style_lines(
    cursor: QTextCursor, first: QTextBlock, last: QTextBlock, language: str, palette: Palette
) -> None:
    block = first
    while True:
        fmt = block.blockFormat()
        fmt.setBackground(QColor(palette.code_background))
        fmt.setLeftMargin(6)
        fmt.setRightMargin(6)
        fmt.setTopMargin(0)
        fmt.setBottomMargin(6 if block == last else 0)
        fmt.setProperty(CODE_LANGUAGE, language)
        cursor.setPosition(block.position())
        cursor.setBlockFormat(fmt)
        cursor.setPosition(block.position() + block.length() - 1, QTextCursor.MoveMode.KeepAnchor)
        char = QTextCharFormat()
        char.setFontFamilies(CODE_FAMILIES)
        char.setFontStyleHint(QFont.StyleHint.Monospace)
        char.setFontFixedPitch(True)
        cursor.mergeCharFormat(char)
        if block == last:
            return
        block = block.next()


def _colour(cursor: QTextCursor, start: int, code: str, language: str, palette: Palette) -> None:
    # Lines are one character apart in the document as in `code` ("\n" vs a block break).
    colors = kind_colors(palette)
    for span in highlight(code, language):
        cursor.setPosition(start + span.start)
        cursor.setPosition(start + span.end, QTextCursor.MoveMode.KeepAnchor)
        char = QTextCharFormat()
        char.setForeground(colors[span.kind])
        if span.kind == "comment":
            char.setFontItalic(True)
        cursor.mergeCharFormat(char)


def _insert_header(cursor: QTextCursor, first: QTextBlock, language: str, palette: Palette) -> None:
    """Split a header block off in front of the code: the code keeps its formats."""
    cursor.setPosition(first.position())
    cursor.insertBlock(first.blockFormat(), first.charFormat())
    header = QTextBlockFormat()
    header.setBackground(QColor(palette.code_header))
    header.setLeftMargin(6)
    header.setRightMargin(6)
    header.setTopMargin(6)
    header.setProperty(CODE_HEADER, language)
    cursor.movePosition(QTextCursor.MoveOperation.PreviousBlock)
    cursor.setBlockFormat(header)
    label = QTextCharFormat()
    label.setForeground(QColor(palette.code_header_text))
    label.setFontFamilies(CODE_FAMILIES)
    cursor.setBlockCharFormat(label)
    cursor.insertText(language.split(maxsplit=1)[0] if language.strip() else "code", label)
