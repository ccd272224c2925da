"""Each chat keeps its own sampling settings (SQLite, schema 2); new chats start from defaults."""

import sqlite3

import pytest

from kvscope.app.core.settings import SamplingSettings
from kvscope.app.desktop.chat.store import _MIGRATIONS, SCHEMA_VERSION, ChatStore

TIMEOUT_MS = 120_000


def _version_1_database(path):
    """A chats file as KVScope wrote it before chats had their own sampling settings."""
    db = sqlite3.connect(path)
    db.executescript(_MIGRATIONS[0])
    db.execute(
        "INSERT INTO conversations (title, system_prompt, created_at, updated_at) "
        "VALUES ('Old chat', 'Be brief.', 1.0, 1.0)"
    )
    db.execute(
        "INSERT INTO messages (conversation_id, position, role, content, created_at) "
        "VALUES (1, 0, 'user', 'hello', 1.0)"
    )
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    return path


def test_a_version_1_database_upgrades_and_keeps_its_chats(tmp_path):
    store = ChatStore(_version_1_database(tmp_path / "chats.sqlite3"))
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    [old] = store.conversations()
    assert (old.title, old.system_prompt, old.sampling) == ("Old chat", "Be brief.", None)
    assert [m.content for m in store.messages(old.id)] == ["hello"]
    store.set_sampling(old.id, {"temperature": 0.3})
    store.close()
    again = ChatStore(tmp_path / "chats.sqlite3")
    assert again.conversation(old.id).sampling == {"temperature": 0.3}
    again.close()


def test_sampling_round_trips_and_does_not_reorder_chats(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    first = store.create_conversation("First", sampling={"temperature": 1.1, "n": 2})
    second = store.create_conversation("Second")
    assert store.conversation(first.id).sampling == {"temperature": 1.1, "n": 2}
    assert second.sampling is None
    before = [c.id for c in store.conversations()]
    store.set_sampling(first.id, {"temperature": 0.0})
    assert [c.id for c in store.conversations()] == before  # tweaking is not activity
    store._db.execute("UPDATE conversations SET sampling = '{broken' WHERE id = ?", (second.id,))
    assert store.conversation(second.id).sampling is None  # unreadable: the defaults
    store.close()


def test_a_chats_saved_settings_are_validated():
    good = SamplingSettings.from_dict({"temperature": 0.4, "min_p": 0.1, "from_a_newer_app": 1})
    assert (good.temperature, good.min_p, good.repetition_penalty) == (0.4, 0.1, 1.0)
    for bad in ({"min_p": 1.5}, {"repetition_penalty": 0}, {"top_p": "high"}):
        with pytest.raises(ValueError):
            SamplingSettings.from_dict(bad)


def test_each_chat_remembers_its_own_sampling(make_window, qtbot):
    window = make_window(max_tokens=3, temperature=0.0)
    panel = window.chat.sampling
    submitted = []
    real_submit = window.client.submit
    window.client.submit = lambda *args: (submitted.append(args), real_submit(*args))

    tuned = window.chats.new_conversation()
    panel.temperature.setValue(1.3)
    panel.min_p.setValue(0.05)
    panel.repetition_penalty.setValue(1.2)
    plain = window.chats.new_conversation()
    assert (panel.settings().temperature, panel.settings().min_p) == (0.0, 0.0)  # the defaults
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS):
        window.chats.send_message("Hi.", plain)
    assert submitted[-1][3]["temperature"] == 0.0

    window.chats.open_conversation(tuned)
    assert (panel.temperature.value(), panel.repetition_penalty.value()) == (1.3, 1.2)
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS) as done:
        window.chats.send_message("Hi.", tuned)
    assert done.args == [tuned, "complete"]  # the engine took min-p and the penalty
    params = submitted[-1][3]
    assert (params["temperature"], params["min_p"], params["repetition_penalty"]) == (
        1.3,
        0.05,
        1.2,
    )
    other = ChatStore(window.store.path)  # persisted, as a restart reads it
    assert other.conversation(tuned).sampling["temperature"] == 1.3
    assert other.conversation(plain).sampling["temperature"] == 0.0
    other.close()

    panel.make_default.click()  # "Use for new chats"
    assert window.settings.sampling.temperature == 1.3
    window.chats.new_conversation()
    assert panel.settings() == window.settings.sampling
    window.chats.open_conversation(plain)
    assert panel.temperature.value() == 0.0  # an existing chat keeps its own


def test_a_chat_from_before_uses_the_app_defaults(make_window, tmp_path):
    _version_1_database(tmp_path / "chats.sqlite3")  # the path make_window opens
    window = make_window(max_tokens=5, temperature=0.4)
    [old] = window.store.conversations()
    assert window.chats.current_id == old.id
    assert window.chat.sampling.settings().max_tokens == 5
    assert window.chat.sampling.temperature.value() == 0.4
