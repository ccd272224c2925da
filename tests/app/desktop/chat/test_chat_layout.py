"""The chat column lays out at every window width from the minimum up, in both themes: every
bubble and its buttons inside the column's viewport, nothing scrolled sideways, and a code line
longer than the bubble wrapping inside its own block (issue 29, item 3; issue 44: a block that
scrolled sideways at 1400 px)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QApplication, QWidget

LONG_LINE = (
    "result = some_function_with_a_long_name(argument_one, argument_two, argument_three,"
    " argument_four, argument_five)  # and a comment that goes on"
)
WORD = "Supercalifragilistic" + "o" * 120
URL = "https://example.com/" + "a" * 160
USER = f"Why does this fail?\n\n```python\n{LONG_LINE}\n```\n\nSee {URL}"
REPLY = (
    f"Here it is:\n\n```python\n{LONG_LINE}\nprint(result)\n```\n\n"
    f"Example usage: call it with five arguments. {WORD} done.\n\n```\n{'-' * 300}\n```"
)
WIDTHS = (940, 1024, 1400)


def _settle(qtbot) -> None:
    for _ in range(3):
        QApplication.processEvents()
        qtbot.wait(30)


def _right_edge(widget: QWidget, viewport: QWidget) -> int:
    return widget.mapTo(viewport, QPoint(widget.width(), 0)).x()


def _cursor_to_the_longest_line(body) -> None:
    """Put the text cursor at the end of the message's longest line, as a click-drag or the
    keyboard would, and have the view show it: before, the message scrolled sideways."""
    document, longest = body.document(), None
    block = document.begin()
    while block.isValid():
        if longest is None or len(block.text()) > len(longest.text()):
            longest = block
        block = block.next()
    cursor = QTextCursor(longest)
    cursor.movePosition(QTextCursor.EndOfBlock)
    body.setTextCursor(cursor)
    body.ensureCursorVisible()


@pytest.fixture()
def window_with_code(make_window):
    window = make_window()
    conversation = window.store.create_conversation("Long lines")
    window.store.add_message(conversation.id, "user", USER)
    window.store.add_message(
        conversation.id,
        "assistant",
        REPLY,
        alternatives=[REPLY, "short"],
        metrics={"ttft_s": 0.4, "tokens_per_s": 12.0, "prompt_tokens": 30, "generated_tokens": 9},
    )
    window.chats.open_conversation(conversation.id)
    return window


@pytest.mark.parametrize("theme", ["dark", "light"])
def test_bubbles_fit_the_chat_column_at_every_width(window_with_code, qtbot, theme):
    window = window_with_code
    window.set_theme(theme)
    assert window.minimumSizeHint().width() <= 1024  # a 1024 px screen holds the window
    # The columns (chat list, chat, map) fit in 940; the status bar's lines may ask for more.
    assert window.splitter.minimumSizeHint().width() <= WIDTHS[0]
    chat = window.chat
    for width in WIDTHS:
        window.resize(width, 700)
        _settle(qtbot)
        assert window.width() == max(width, window.minimumSizeHint().width())
        # A reply streaming in, then stored, after the stored ones: its code line is long too.
        chat.start_pending()
        chat.update_pending([REPLY[: len(REPLY) // 2]], 0, None)
        _settle(qtbot)
        bubbles = chat.bubbles()
        for bubble in bubbles:
            _cursor_to_the_longest_line(bubble.body)
        _settle(qtbot)
        viewport = chat.message_scroll.viewport()
        outer = chat.message_scroll.horizontalScrollBar()
        assert (outer.value(), outer.maximum()) == (0, 0), f"{width}: the column scrolls sideways"
        assert chat.messages.width() == viewport.width()
        for bubble in bubbles:
            assert 0 <= bubble.mapTo(viewport, QPoint(0, 0)).x()
            assert _right_edge(bubble, viewport) <= viewport.width(), f"{width}: bubble cut off"
            buttons = [bubble.copy, bubble.edit, bubble.regenerate, bubble.next_alt]
            for button in [b for b in buttons if b.isVisible()] + bubble.body.copy_buttons():
                assert _right_edge(button, viewport) <= viewport.width() - 12, (
                    f"{width}: {button.text()} cut off"
                )
                assert _right_edge(button, bubble) <= bubble.width()
            body = bubble.body
            assert body.horizontalScrollBar().value() == 0, f"{width}: the message shifted"
            assert _right_edge(body, viewport) <= viewport.width()
        # The long code lines wrap inside their blocks, which stay the bubble's width.
        scrollers = [s for b in bubbles for s in b.body.code_scrollers()]
        assert len(scrollers) == 4  # the question, the reply twice, the half-streamed reply once
        for scroller in scrollers:
            assert scroller.horizontalScrollBar().maximum() == 0, f"{width}: code scrolls"
            rows = scroller.document().firstBlock().layout().lineCount()
            assert rows > 1, f"{width}: the long line did not wrap"
            assert _right_edge(scroller, scroller.parentWidget()) <= scroller.parentWidget().width()
        window.chats.open_conversation(window.chats.current_id)  # the stored two again
    window.grab()  # paints without error at the last width


def test_a_long_code_line_wraps_under_its_indent_and_the_text_after_stays_clear(qtbot):
    from kvscope.app.desktop.chat.code_scroller import CODE_PADDING, HANG_PX
    from kvscope.app.desktop.chat.markdown_view import MarkdownView

    view = MarkdownView()
    qtbot.addWidget(view)
    view.resize(300, 200)
    view.show()
    view.set_markdown(f"```python\nif x:\n    {LONG_LINE}\n```\nafter")
    _settle(qtbot)
    (scroller,) = view.code_scrollers()
    assert scroller.horizontalScrollBar().maximum() == 0  # nothing to scroll sideways
    wrapped = scroller.document().firstBlock().next()
    layout = wrapped.layout()
    assert layout.lineCount() > 2
    # Its wrapped rows start right of its own indentation, never left of it.
    first_row, next_row = layout.lineAt(0), layout.lineAt(1)
    text_start = first_row.cursorToX(4)[0]  # after the four spaces
    assert next_row.x() >= text_start + HANG_PX - 1 > CODE_PADDING
    after = view.document().lastBlock()
    after_top = view.document().documentLayout().blockBoundingRect(after).top()
    assert scroller.geometry().bottom() < after_top  # the text after the code is not covered
    assert view.horizontalScrollBar().value() == 0
    # Wide enough for the line: one row each, no room kept for more.
    view.resize(1600, 200)
    _settle(qtbot)
    assert layout.lineCount() == 1
    assert scroller.height() < 3 * scroller.fontMetrics().lineSpacing() + 4


def test_entering_edit_mode_does_not_move_the_chat(window_with_code, qtbot):
    from PySide6.QtCore import Qt

    window = window_with_code
    window.resize(1024, 700)
    _settle(qtbot)
    chat = window.chat
    bar = chat.message_scroll.verticalScrollBar()
    assert bar.maximum() > 0
    bar.setValue(bar.maximum() // 2)
    _settle(qtbot)

    def layout() -> tuple:
        bubbles = [
            b.mapTo(chat, QPoint(0, 0)).toTuple() + b.size().toTuple() for b in chat.bubbles()
        ]
        return (
            window.splitter.sizes(),
            chat.message_scroll.geometry().getRect(),
            bar.value(),
            bubbles,
        )

    before = layout()
    user = chat.bubbles()[0]
    qtbot.mouseClick(user.edit, Qt.LeftButton)
    _settle(qtbot)
    assert chat.editing_message_id() == user.message_id and chat.edit_banner.isVisible()
    assert layout() == before
    qtbot.keyClick(chat.composer, Qt.Key_Escape)
    _settle(qtbot)
    assert chat.editing_message_id() == -1 and layout() == before
