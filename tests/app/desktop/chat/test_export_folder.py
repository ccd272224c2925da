"""Issue 29: Export starts in the user's Documents (QStandardPaths), not the working folder,
and then in the folder of the last export."""

from __future__ import annotations

from pathlib import Path

import kvscope.app.desktop.chat.conversation_list as conversation_list
from kvscope.app.desktop.chat.conversation_list import ConversationList
from kvscope.app.desktop.chat.export import export_folder
from kvscope.app.desktop.chat.store import ChatStore


def test_export_starts_in_documents_then_in_the_last_folder(qtbot, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "Documents").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_DOCUMENTS_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))  # no user-dirs.dirs there
    monkeypatch.setenv("KVSCOPE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)  # the working folder, where the dialog used to start
    store = ChatStore(tmp_path / "chats.sqlite3")
    conv = store.create_conversation("Notes on paging")
    store.add_message(conv.id, "user", "What is a block table?")
    chats = ConversationList(store)
    qtbot.addWidget(chats)
    chats.refresh()

    asked: list[str] = []
    answers = [str(tmp_path / "elsewhere" / "mine.md"), ""]

    def pick(_parent, _caption, start, kind):
        asked.append(start)
        return answers.pop(0), kind

    monkeypatch.setattr(conversation_list.QFileDialog, "getSaveFileName", pick)
    assert export_folder() == home / "Documents"
    (tmp_path / "elsewhere").mkdir()
    chats.ask_export(conv.id, "markdown")
    assert asked[0] == str(home / "Documents" / "Notes-on-paging.md")
    assert (tmp_path / "elsewhere" / "mine.md").read_text().startswith("# Notes on paging")

    chats.ask_export(conv.id, "json")  # remembered: the next one starts where that one went
    assert Path(asked[1]) == tmp_path / "elsewhere" / "Notes-on-paging.json"
    assert export_folder() == tmp_path / "elsewhere"

    (tmp_path / "elsewhere" / "mine.md").unlink()
    (tmp_path / "elsewhere").rmdir()  # a remembered folder that is gone: Documents again
    assert export_folder() == home / "Documents"
