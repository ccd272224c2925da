"""The structured-output field in the chat column, open, with an error and with a JSON reply:
at 1024x700 and 1400x900 every part of it and the composer lie inside the window, the messages
keep room to scroll, and the indented reply is drawn as a code block. Pictures of each size are
saved in the test's folder, to look at."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import QPoint, QRect
from PySide6.QtWidgets import QApplication, QWidget

from kvscope.app.desktop.chat.structured_output import json_markdown

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city", "days"],
}
REPLY = '{"city":"Lisbon","days":4}'
SIZES = ((1024, 700), (1400, 900))
MIN_MESSAGES_HEIGHT = 80  # the messages keep room for a few lines, and scroll


def _settle(qtbot) -> None:
    for _ in range(3):
        QApplication.processEvents()
        qtbot.wait(30)


def _rect_in(widget: QWidget, window: QWidget) -> QRect:
    return QRect(widget.mapTo(window, QPoint(0, 0)), widget.size())


@pytest.fixture()
def structured_chat(make_window, qtbot):
    window = make_window()
    conversation = window.store.create_conversation("Trip")
    window.store.add_message(conversation.id, "user", "Plan a short trip.")
    window.store.add_message(conversation.id, "assistant", REPLY, metrics={"ttft_s": 0.3})
    window.chats.open_conversation(conversation.id)
    window.chat.sampling_toggle.setChecked(True)
    field = window.chat.sampling.structured
    field.enabled.setChecked(True)
    field.editor.setPlainText(json.dumps(SCHEMA, indent=2))
    field.flush()
    return window


@pytest.mark.parametrize("theme", ["dark", "light"])
def test_the_open_field_and_a_json_reply_fit_the_window(structured_chat, qtbot, tmp_path, theme):
    window = structured_chat
    window.set_theme(theme)
    chat, field = window.chat, window.chat.sampling.structured
    for width, height in SIZES:
        window.resize(width, height)
        _settle(qtbot)
        assert (window.width(), window.height()) == (width, height)
        inside = window.centralWidget().geometry()
        for part in (chat.sampling_scroll, chat.composer, chat.send):
            assert part.isVisibleTo(window)
            assert inside.contains(_rect_in(part, window)), (part.objectName(), width, height)
        chat.sampling_scroll.show_structured()  # as checking the box does
        _settle(qtbot)
        viewport = _rect_in(chat.sampling_scroll.viewport(), window)
        for part in (field.enabled, field.editor):
            assert viewport.contains(_rect_in(part, window)), (part.objectName(), width, height)
        if chat.messages.height() > chat.message_scroll.viewport().height():  # it scrolls:
            last = chat.bubbles()[-1]  # so no blank after the last reply
            bottom = last.mapTo(chat.messages, QPoint(0, last.height())).y()
            blank = chat.messages.height() - bottom
            assert blank <= chat.message_layout.contentsMargins().bottom()
        assert chat.message_scroll.viewport().height() >= MIN_MESSAGES_HEIGHT
        checkbox = field.enabled
        assert checkbox.width() >= checkbox.sizeHint().width()  # its label is not cut
        reply = chat.bubbles()[-1]
        assert reply.body.markdown() == json_markdown(REPLY)
        assert reply.body.copy_buttons()  # a code block, with its Copy button
        assert window.grab().save(str(tmp_path / f"structured_{theme}_{width}x{height}.png"))

    field.editor.setPlainText('{"type": "object",\n "properties": {')
    field.flush()
    window.resize(*SIZES[0])
    _settle(qtbot)
    assert field.error.isVisibleTo(window) and "Not valid JSON" in field.error.text()
    error = _rect_in(field.error, window)
    assert window.centralWidget().geometry().contains(error)
    assert field.error.height() >= field.error.heightForWidth(field.error.width())  # wrapped
    assert window.grab().save(str(tmp_path / f"structured_{theme}_error.png"))
