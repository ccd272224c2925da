"""Chat export: Markdown and JSON hold exactly the stored chat, and exporting changes nothing."""

import json
from pathlib import Path

import pytest

import kvscope.app.desktop.chat.conversation_list as conversation_list
from kvscope.app.desktop.chat.conversation_list import ConversationList
from kvscope.app.desktop.chat.export import EXPORT_VERSION, export_chat, suggested_file_name
from kvscope.app.desktop.chat.store import ChatStore


@pytest.fixture()
def store(tmp_path):
    s = ChatStore(tmp_path / "chats.sqlite3")
    conv = s.create_conversation("Trip to *Rome*", system_prompt="Be brief.\nUse lists.")
    s.add_message(conv.id, "user", "Where should I eat?\nCheap, please.")
    s.add_message(
        conv.id,
        "assistant",
        "Try **Da Enzo**.",
        status="stopped",
        alternatives=["Trip to Testaccio.", "Try **Da Enzo**."],
        selected=1,
        metrics={"generated_tokens": 9, "sample_tokens": [4, 5]},
    )
    s.add_message(conv.id, "user", "Thanks!")
    yield s
    s.close()


def _rows(store: ChatStore) -> list:
    return [(c, store.messages(c.id)) for c in store.conversations()]


def test_markdown_export_has_a_heading_roles_and_every_sample(store, tmp_path):
    before = _rows(store)
    cid = store.conversations()[0].id
    path = export_chat(store, cid, tmp_path / "chat.md", "markdown")
    assert path.read_text(encoding="utf-8") == (
        "# Trip to *Rome*\n\n"
        "**System prompt:**\n\n> Be brief.\n> Use lists.\n\n"
        "## You\n\nWhere should I eat?\nCheap, please.\n\n"
        "## Assistant (stopped), sample 2 of 2 (shown)\n\nTry **Da Enzo**.\n\n"
        "## Assistant (stopped), sample 1 of 2\n\nTrip to Testaccio.\n\n"
        "## You\n\nThanks!\n"
    )
    assert _rows(store) == before  # export only reads


def test_json_export_is_versioned_and_holds_every_stored_field(store, tmp_path):
    before = _rows(store)
    conv, messages = before[0]
    path = export_chat(store, conv.id, tmp_path / "chat.json", "json")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["kvscope_chat_export"] == EXPORT_VERSION and len(data["conversations"]) == 1
    chat = data["conversations"][0]
    assert chat["title"] == conv.title and chat["system_prompt"] == conv.system_prompt
    assert chat["created_at"] == conv.created_at and chat["updated_at"] == conv.updated_at
    assert len(chat["messages"]) == len(messages)
    for exported, stored in zip(chat["messages"], messages, strict=True):
        assert exported["role"] == stored.role and exported["content"] == stored.content
        assert exported["alternatives"] == stored.alternatives
        assert exported["selected"] == stored.selected and exported["status"] == stored.status
        assert exported["metrics"] == stored.metrics
        assert exported["created_at"] == stored.created_at
    assert _rows(store) == before


def test_an_unknown_format_and_a_missing_chat_are_refused(store, tmp_path):
    with pytest.raises(ValueError, match="format"):
        export_chat(store, store.conversations()[0].id, tmp_path / "x.txt", "html")
    with pytest.raises(KeyError):
        export_chat(store, 999, tmp_path / "x.md", "markdown")
    assert not list(tmp_path.glob("x.*"))


def test_suggested_file_names_are_safe():
    assert suggested_file_name("Trip to Rome?", "markdown") == "Trip-to-Rome.md"
    assert suggested_file_name("../../etc/passwd", "json") == "etc-passwd.json"
    assert suggested_file_name("***", "json") == "chat.json"


def test_the_chat_list_exports_where_the_user_picks(store, qtbot, tmp_path, monkeypatch):
    chats = ConversationList(store)
    qtbot.addWidget(chats)
    chats.refresh()
    cid = store.conversations()[0].id
    target = tmp_path / "picked.json"
    asked = []

    def pick(_parent, _caption, name, kind):
        asked.append((name, kind))
        return str(target), kind

    monkeypatch.setattr(conversation_list.QFileDialog, "getSaveFileName", pick)
    chats.ask_export(cid, "json")
    assert [(Path(name).name, kind) for name, kind in asked] == [
        ("Trip-to-Rome.json", "JSON (*.json)")
    ]
    assert json.loads(target.read_text())["conversations"][0]["id"] == cid

    monkeypatch.setattr(conversation_list.QFileDialog, "getSaveFileName", lambda *a: ("", ""))
    chats.ask_export(cid, "markdown")  # cancelled: nothing written, no error
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".md", ".json")) == [
        "picked.json"
    ]


def test_the_context_menu_offers_both_exports(store, qtbot, monkeypatch):
    chats = ConversationList(store)
    qtbot.addWidget(chats)
    chats.refresh()
    cid = store.conversations()[0].id
    menu = chats.menu_for(cid)
    texts = [a.text() for a in menu.actions() if not a.isSeparator()]
    assert texts == ["Rename…", "Export as Markdown…", "Export as JSON…", "Delete…"]
    exported = []
    monkeypatch.setattr(chats, "ask_export", lambda cid, fmt: exported.append((cid, fmt)))
    for action in menu.actions():
        if action.text().startswith("Export"):
            action.trigger()
    assert exported == [(cid, "markdown"), (cid, "json")]
