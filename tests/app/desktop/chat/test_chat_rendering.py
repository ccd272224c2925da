"""How a message renders: line breaks kept, code blocks highlighted with a working Copy button,
titles as plain text, the token count of the sample shown, and "no results" in the chat search."""

import re

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QTextFormat

from kvscope.app.desktop.chat.code_blocks import KIND_COLORS, code_blocks
from kvscope.app.desktop.chat.code_highlight import highlight
from kvscope.app.desktop.chat.conversation_list import ConversationList
from kvscope.app.desktop.chat.markdown import LINE_SEPARATOR, keep_line_breaks, plain_text
from kvscope.app.desktop.chat.markdown_view import MarkdownView
from kvscope.app.desktop.chat.message_bubble import MessageBubble, format_metrics
from kvscope.app.desktop.chat.store import ChatStore

HAIKU = "An old silent pond\nA frog jumps into the pond—\nsplash! Silence again."
CODE = 'def greet(name):\n\t# say hello\n    return f"Hello, {name}!"  # 42\n\nprint(greet("x"))'


@pytest.fixture()
def view(qtbot):
    v = MarkdownView()
    v.resize(600, 300)
    qtbot.addWidget(v)
    v.show()
    return v


def _blocks(view: MarkdownView) -> list:
    found, block = [], view.document().begin()
    while block.isValid():
        found.append(block)
        block = block.next()
    return found


# ---- line breaks -----------------------------------------------------------------------------
def test_a_single_newline_breaks_the_line_inside_its_paragraph(view):
    view.set_markdown(f"A haiku:\n\n{HAIKU}\n\nThe end.")
    texts = [b.text() for b in _blocks(view)]
    assert texts == ["A haiku:", HAIKU.replace("\n", LINE_SEPARATOR), "The end."]
    view.grab()
    poem = _blocks(view)[1]
    assert poem.layout().lineCount() == 3  # three lines on screen, one paragraph
    assert "\ue000" not in view.document().toPlainText()


def test_line_breaks_leave_lists_headings_tables_and_rules_alone(view):
    text = "Title\n=====\n1. first\n   more of it\n2. second\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    view.set_markdown(text + "\nabove\n\n---\nbelow")
    blocks = _blocks(view)
    assert blocks[0].text() == "Title" and blocks[0].blockFormat().headingLevel() == 1
    items = [b for b in blocks if b.textList() is not None]
    assert [b.text() for b in items] == [f"first{LINE_SEPARATOR}more of it", "second"]
    cursor = view.textCursor()
    cursor.setPosition(next(b for b in blocks if b.text() == "1").position())
    assert cursor.currentTable() is not None
    ruled = [
        b
        for b in blocks
        if b.blockFormat().hasProperty(QTextFormat.BlockTrailingHorizontalRulerWidth)
    ]
    assert len(ruled) == 1 and "below" in view.document().toPlainText()


def test_code_fences_keep_their_lines_exactly():
    text = f"```python\n{CODE}\n```\nafter\n~~~\nx\ny\n~~~"
    marked = keep_line_breaks(text)
    inside = marked.split("```")[1] + marked.split("~~~")[1]
    assert "\ue000" not in inside and "after\n" in marked


# ---- code blocks -----------------------------------------------------------------------------
def test_the_copy_button_copies_the_code_as_written(view, qtbot):
    view.set_markdown(f"Try this:\n\n```python\n{CODE}\n```\n\nand\n\n```\nplain  text\n```")
    buttons = view.copy_buttons()
    assert [b.code for b in buttons] == [CODE, "plain  text"]
    view.grab()
    header = code_blocks(view.document())[0].header
    top = view.document().documentLayout().blockBoundingRect(header).top()
    assert buttons[0].isVisible() and abs(buttons[0].y() - top) <= 1  # on its code's header
    QGuiApplication.clipboard().clear()
    qtbot.mouseClick(buttons[0], Qt.LeftButton)
    assert QGuiApplication.clipboard().text() == CODE
    assert buttons[0].text() == "Copied"


def test_copy_buttons_follow_a_streaming_reply(view):
    view.set_markdown("```js\nlet a = 1;")  # the fence is still open
    assert [b.code for b in view.copy_buttons()] == ["let a = 1;"]
    first = view.copy_buttons()[0]
    view.set_markdown("```js\nlet a = 1;\nlet b = 2;\n```\nDone.")
    assert view.copy_buttons() == [first] and first.code == "let a = 1;\nlet b = 2;"
    view.set_markdown("No code now.")
    assert view.copy_buttons() == []


def test_code_is_highlighted_and_hostile_code_stays_text(view):
    view.set_markdown('```python\ndef f(): return "<img src=/etc/passwd>"  # hi\n```')
    block = code_blocks(view.document())[0].header.next()
    colours = {}
    it = block.begin()
    while not it.atEnd():
        fragment = it.fragment()
        colours[fragment.text()] = fragment.charFormat().foreground().color()
        it += 1
    assert colours["def"] == KIND_COLORS["keyword"]
    assert colours['"<img src=/etc/passwd>"'] == KIND_COLORS["string"]
    assert colours["# hi"] == KIND_COLORS["comment"]
    assert view.copy_buttons()[0].code == 'def f(): return "<img src=/etc/passwd>"  # hi'


@pytest.mark.parametrize(
    ("language", "code", "expected"),
    [
        ("py", "import os  # x\nx = 'a'", {"import": "keyword", "# x": "comment", "'a'": "string"}),
        (
            "ts",
            "const s = `a\nb`; // c",
            {"const": "keyword", "`a\nb`": "string", "// c": "comment"},
        ),
        (
            "cpp",
            "#include <x>\nint n = 0x1F;",
            {"#include": "meta", "int": "builtin", "0x1F": "number"},
        ),
        (
            "rust",
            "fn f<'a>() { println!(\"{}\", 'c'); }",
            {"fn": "keyword", "println!": "meta", "'c'": "string"},
        ),
        (
            "bash",
            'for f in *; do echo "$f"; done # ok',
            {"for": "keyword", '"$f"': "string", "# ok": "comment"},
        ),
        (
            "json",
            '{"k": [1.5, true, "v"]}',
            {'"k"': "key", "1.5": "number", "true": "constant", '"v"': "string"},
        ),
    ],
)
def test_highlighter_names_the_usual_tokens(language, code, expected):
    found = {code[s.start : s.end]: s.kind for s in highlight(code, language)}
    assert {text: found.get(text) for text in expected} == expected


def test_an_unknown_language_is_left_plain():
    assert highlight("def x(): pass", "brainfuck") == [] and highlight("def", "") == []


# ---- titles and search -----------------------------------------------------------------------
def test_titles_lose_their_markdown(qtbot, tmp_path):
    assert plain_text("# How do I **sort** a `list`?") == "How do I sort a list?"
    assert plain_text("[Rust](https://rust-lang.org) vs _Go_ ![logo](x.png)") == (
        "Rust vs Go [image: logo]"
    )
    assert plain_text("snake_case_name <b>raw</b>") == "snake_case_name <b>raw</b>"
    store = ChatStore(tmp_path / "chats.sqlite3")
    store.create_conversation("## **Bold** `title`")
    chats = ConversationList(store)
    qtbot.addWidget(chats)
    chats.refresh()
    assert chats.list.item(0).text() == "Bold title"
    store.close()


def test_a_search_that_matches_nothing_says_so(qtbot, tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    store.create_conversation("Trip to Rome")
    chats = ConversationList(store)
    qtbot.addWidget(chats)
    chats.show()
    chats.refresh()
    assert not chats.no_results.isVisible()
    chats.search.setText("zebra")
    assert chats.list.count() == 0 and chats.no_results.isVisible()
    assert "zebra" in chats.no_results.text()
    chats.search.setText("rome")
    assert chats.list.count() == 1 and not chats.no_results.isVisible()
    store.close()


# ---- the sample shown ------------------------------------------------------------------------
def test_a_reply_of_two_samples_counts_the_tokens_of_the_one_shown(qtbot):
    metrics = {
        "prompt_tokens": 30,
        "cached_tokens": 0,
        "generated_tokens": 31,
        "tokens_per_s": 10.0,
        "sample_tokens": [24, 7],
        "finish_reasons": ["length", "stop"],
    }
    bubble = MessageBubble("assistant", 1)
    qtbot.addWidget(bubble)
    bubble.set_content("a", alternatives=["a", "b"], selected=0, metrics=metrics)
    assert (
        re.search(r"· 24 tok ·", bubble.metrics.text())
        and "hit max tokens" in bubble.metrics.text()
    )
    assert "31 tok" not in bubble.metrics.text()
    bubble.set_content("b", alternatives=["a", "b"], selected=1, metrics=metrics)
    assert bubble.metrics.text().endswith("· 7 tok") and "all 2 samples" in bubble.metrics.text()
    # Stored before per-sample counts existed: the total, said to be the total.
    old = {"generated_tokens": 48, "finish_reason": "length"}
    assert format_metrics(old, 1, 2) == "48 tok over 2 samples · hit max tokens"
    assert format_metrics({"generated_tokens": 5}) == "5 tok"


def test_ttft_counts_from_send_and_names_a_wait_for_the_engine():
    from kvscope.app.core.engine_messages import ReplyUpdate
    from kvscope.app.desktop.chat.pending_reply import PendingReply

    # Sent at t=1000; the engine took it 31.2 s later (loading) and answered 1.9 s after that.
    update = ReplyUpdate("r1", ["Paris"], [None], False, 1, 9, 0, 1.9, None, arrival_time=1031.2)
    pending = PendingReply("r1", 1, client=None, sent_at=1000.0)  # type: ignore[arg-type]
    pending.update = update
    metrics = pending.metrics()
    assert metrics is not None
    assert metrics["ttft_s"] == pytest.approx(33.1) and metrics["waited_s"] == pytest.approx(31.2)
    assert format_metrics(metrics).startswith(
        "TTFT 33.10 s (waited 31.2 s for the engine, then 1.90 s)"
    )
    # Taken at once: the plain figure.
    pending.sent_at = 1031.0
    assert format_metrics(pending.metrics() or {}).startswith("TTFT 2.10 s ·")
