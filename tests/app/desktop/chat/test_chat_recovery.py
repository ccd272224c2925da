"""A damaged chats database: moved aside (never deleted), salvaged row by row, the app starts."""

import sqlite3

from kvscope.app.desktop.chat.recovery import open_chat_store, salvage
from kvscope.app.desktop.chat.store import _MIGRATIONS, ChatStore


def _filled(path):
    store = ChatStore(path)
    cid = store.create_conversation("Tea", "Be brief.").id
    store.add_message(cid, "user", "Tell me about tea.")
    store.add_message(cid, "assistant", "It is a drink.")
    other = store.create_conversation("Rivers").id
    store.add_message(other, "user", "Name a river.")
    store.close()
    return path


def test_a_file_that_is_not_a_database_is_moved_aside(tmp_path):
    path = tmp_path / "chats.sqlite3"
    path.write_bytes(b"this is not SQLite at all" * 100)
    store, problem = open_chat_store(path)
    damaged = list(tmp_path.glob("chats.sqlite3.damaged-*"))
    assert len(damaged) == 1 and damaged[0].read_bytes().startswith(b"this is not SQLite")
    assert "could not be read" in problem and str(damaged[0]) in problem
    assert store.conversations() == []  # a fresh, working database
    conversation = store.create_conversation("New")
    assert store.conversation(conversation.id).title == "New"


def test_readable_rows_are_salvaged(tmp_path):
    old = _filled(tmp_path / "old.sqlite3")
    store = ChatStore(tmp_path / "new.sqlite3")
    counts = salvage(old, store)
    assert counts == {"conversations": 2, "messages": 3}
    titles = sorted(c.title for c in store.conversations())
    assert titles == ["Rivers", "Tea"]
    tea = next(c for c in store.conversations() if c.title == "Tea")
    assert [m.content for m in store.messages(tea.id)] == ["Tell me about tea.", "It is a drink."]


def test_salvage_from_a_file_before_per_chat_sampling(tmp_path):
    """A damaged version-1 file (no sampling column) still gives up its chats."""
    old = tmp_path / "old.sqlite3"
    db = sqlite3.connect(old)
    db.executescript(_MIGRATIONS[0])
    db.execute(
        "INSERT INTO conversations (title, system_prompt, created_at, updated_at) "
        "VALUES ('Tea', 'Be brief.', 1.0, 1.0)"
    )
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    store = ChatStore(tmp_path / "new.sqlite3")
    assert salvage(old, store) == {"conversations": 1, "messages": 0}
    [tea] = store.conversations()
    assert (tea.title, tea.system_prompt, tea.sampling) == ("Tea", "Be brief.", None)


def test_salvage_keeps_a_chats_own_sampling(tmp_path):
    old = ChatStore(tmp_path / "old.sqlite3")
    old.create_conversation("Warm", sampling={"temperature": 1.2})
    old.close()
    store = ChatStore(tmp_path / "new.sqlite3")
    salvage(tmp_path / "old.sqlite3", store)
    assert store.conversations()[0].sampling == {"temperature": 1.2}


def test_a_healthy_database_opens_untouched(tmp_path):
    path = _filled(tmp_path / "chats.sqlite3")
    store, problem = open_chat_store(path)
    assert problem is None and len(store.conversations()) == 2
    assert not list(tmp_path.glob("*.damaged-*"))


def test_the_window_starts_on_a_damaged_database(make_window, tmp_path, qtbot):
    (tmp_path / "chats.sqlite3").write_bytes(b"\x00garbage" * 512)
    window = make_window()
    assert "chats database could not be read" in window.last_error
    assert list(tmp_path.glob("chats.sqlite3.damaged-*"))


def test_an_unusable_data_dir_keeps_chats_in_memory(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the data dir should be")
    store, problem = open_chat_store(blocker / "chats.sqlite3")
    assert "will not be saved" in problem
    conversation = store.create_conversation("Still works")
    assert store.conversation(conversation.id).title == "Still works"
    assert blocker.read_text() == "a file where the data dir should be"


def test_an_unusable_data_dir_falls_back_to_a_temporary_one(tmp_path, monkeypatch):
    from kvscope.app.core import paths

    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("KVSCOPE_DATA_DIR", str(blocker / "data"))
    monkeypatch.setattr(paths, "_stand_in", None)
    monkeypatch.setattr(paths, "data_dir_problem", None)
    folder = paths.data_dir()
    assert folder.is_dir() and folder != blocker / "data"
    assert paths.data_dir() == folder  # one stand-in per session
    assert "cannot be used" in paths.data_dir_problem and str(folder) in paths.data_dir_problem
