"""Issue 29: Regenerate keeps the old reply as an alternative, in SQLite: a "‹ 2/2 ›" switcher
on the reply, the chosen one is what the next turn's context holds, it survives a restart and
the export names it; chat databases from before open (migration 3 -> 4)."""

from __future__ import annotations

import json
import sqlite3

from kvscope.app.desktop.chat.export import chat_markdown
from kvscope.app.desktop.chat.store import _MIGRATIONS, SCHEMA_VERSION, ChatStore

TIMEOUT_MS = 120_000
OLD_METRICS = {
    "ttft_s": 0.5,
    "tokens_per_s": 10.0,
    "sample_tokens": [7],
    "finish_reasons": ["stop"],
}


def _version_3_db(path) -> None:
    db = sqlite3.connect(path)
    for migration in _MIGRATIONS[:3]:
        for statement in migration.split(";"):
            if statement.strip():
                db.execute(statement)
    db.execute(
        "INSERT INTO conversations (title, system_prompt, created_at, updated_at) "
        "VALUES ('Old chat', '', 1.0, 1.0)"
    )
    db.execute(
        "INSERT INTO messages (conversation_id, position, role, content, created_at) "
        "VALUES (1, 0, 'user', 'Name a colour.', 1.0)"
    )
    db.execute(
        "INSERT INTO messages (conversation_id, position, role, content, status, metrics, "
        "created_at) VALUES (1, 1, 'assistant', 'Blue.', 'stopped', ?, 1.0)",
        (json.dumps(OLD_METRICS),),
    )
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()


def test_a_version_3_database_opens_and_regenerating_keeps_its_old_reply(tmp_path):
    path = tmp_path / "chats.sqlite3"
    _version_3_db(path)
    store = ChatStore(path)
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    user, old = store.messages(1)
    assert (old.content, old.status, old.alternative_metrics) == ("Blue.", "stopped", [])

    new_metrics = {"ttft_s": 0.2, "tokens_per_s": 20.0, "sample_tokens": [3, 4],
                   "finish_reasons": ["stop", "length"]}  # fmt: skip
    both = store.add_alternatives(old.id, ["Red.", "Green."], new_metrics, "complete", shown=1)
    assert both.id == old.id and both.alternatives == ["Blue.", "Red.", "Green."]
    assert (both.selected, both.content, both.status) == (2, "Green.", "complete")
    assert both.metrics["ttft_s"] == 0.2
    assert both.metrics["sample_tokens"] == [7, 3, 4]  # one per alternative, as the bubble reads
    assert both.metrics["finish_reasons"] == ["stop", "stop", "length"]

    back = store.select_alternative(old.id, 0)  # the old reply, with its own figures and status
    assert (back.content, back.status, back.metrics["ttft_s"]) == ("Blue.", "stopped", 0.5)
    store.close()

    again = ChatStore(path)  # a restart
    _, kept = again.messages(1)
    assert kept.alternatives == ["Blue.", "Red.", "Green."] and kept.selected == 0
    assert kept.content == "Blue."
    text = chat_markdown(again.conversation(1), again.messages(1))
    assert "sample 1 of 3 (shown)" in text and text.index("Blue.") < text.index("Red.")
    again.close()


def test_regenerate_in_the_window_keeps_both_and_the_chosen_one_is_the_context(
    make_window, qtbot, tmp_path
):
    window = make_window(max_tokens=5, temperature=1.0)
    chats = window.chats
    submitted = []
    real_submit = window.client.submit
    window.client.submit = lambda *args: (submitted.append(args), real_submit(*args))
    with qtbot.waitSignal(chats.reply_finished, timeout=TIMEOUT_MS):
        cid = chats.send_message("Name a colour.", chats.new_conversation())
    first = window.store.messages(cid)[-1]
    with qtbot.waitSignal(chats.reply_finished, timeout=TIMEOUT_MS):
        window.chat.bubbles()[-1].regenerate.click()
    # The regenerated request's context did not hold the reply it replaces.
    assert [t["role"] for t in submitted[1][2]] == ["user"]
    reply = window.store.messages(cid)[-1]
    assert reply.id == first.id and reply.alternatives[0] == first.content
    assert len(reply.alternatives) == 2 and reply.selected == 1
    bubble = window.chat.bubbles()[-1]
    assert bubble.alt_label.isVisibleTo(bubble) and bubble.alt_label.text() == "2/2"

    bubble.prev_alt.click()  # back to the first reply: that is what the next turn sees
    chosen = window.store.messages(cid)[-1]
    assert chosen.selected == 0 and chosen.content == first.content
    assert window.chat.bubbles()[-1].alt_label.text() == "1/2"
    with qtbot.waitSignal(chats.reply_finished, timeout=TIMEOUT_MS):
        chats.send_message("And another?", cid)
    context = submitted[2][2]
    assert [t["role"] for t in context] == ["user", "assistant", "user"]
    assert context[1]["content"] == first.content

    # After a restart the reply still has both, the chosen one shown.
    store = ChatStore(tmp_path / "chats.sqlite3")
    kept = store.messages(cid)[1]
    assert kept.alternatives == reply.alternatives and kept.selected == 0
    store.close()
