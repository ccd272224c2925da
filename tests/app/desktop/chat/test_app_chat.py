"""The chat side of the app: the SQLite store, streaming replies, stop, edit, n > 1, overflow."""

import re
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
from repo_paths import REPO

from kvscope.app.core.context_fit import ContextOverflow, fit_conversation
from kvscope.app.core.request_ids import group_of
from kvscope.app.desktop.chat.store import SCHEMA_VERSION, ChatStore
from kvscope.engine.kv.snapshot import BlockState

TIMEOUT_MS = 120_000  # the CPU is shared; a reply of a few tokens can take seconds


# ---- the store -------------------------------------------------------------------------------
@pytest.fixture()
def store(tmp_path):
    s = ChatStore(tmp_path / "chats.sqlite3")
    yield s
    s.close()


def test_store_crud_and_schema_version(store):
    conv = store.create_conversation("Trip to Rome", system_prompt="Be brief.")
    store.add_message(conv.id, "user", "Where should I eat?")
    store.add_message(conv.id, "assistant", "Trastevere.", metrics={"ttft_s": 0.5})
    store.rename(conv.id, "Rome food")
    store.set_system_prompt(conv.id, "Be very brief.")
    got = store.conversation(conv.id)
    assert (got.title, got.system_prompt) == ("Rome food", "Be very brief.")
    msgs = store.messages(conv.id)
    assert [(m.role, m.content, m.position) for m in msgs] == [
        ("user", "Where should I eat?", 0),
        ("assistant", "Trastevere.", 1),
    ]
    assert msgs[1].metrics == {"ttft_s": 0.5}
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.delete_conversation(conv.id)
    assert store.conversations() == []
    assert store.messages(conv.id) == []  # cascaded
    with pytest.raises(ValueError, match="empty"):
        store.rename(store.create_conversation().id, "  ")


def test_store_search_matches_titles_and_messages_newest_first(store):
    a = store.create_conversation("Volcanoes")
    b = store.create_conversation("Tea")
    store.add_message(b.id, "user", "Tell me about 100% Darjeeling")
    store.add_message(a.id, "user", "Are volcanoes hot?")
    assert [c.id for c in store.conversations()] == [a.id, b.id]  # a was active last
    assert [c.id for c in store.conversations("darjeeling")] == [b.id]
    assert [c.id for c in store.conversations("VOLCANO")] == [a.id]
    assert [c.id for c in store.conversations("100%")] == [b.id]  # LIKE wildcards escaped
    assert store.conversations("nothing like this") == []


def test_store_edit_truncates_later_messages_and_alternatives(store):
    conv = store.create_conversation()
    first = store.add_message(conv.id, "user", "one")
    store.add_message(conv.id, "assistant", "A", alternatives=["A", "B"], selected=0)
    store.add_message(conv.id, "user", "two")
    store.add_message(conv.id, "assistant", "C")
    reply = store.messages(conv.id)[1]
    assert store.select_alternative(reply.id, 1).content == "B"
    with pytest.raises(ValueError, match="out of range"):
        store.select_alternative(reply.id, 2)
    store.edit_and_truncate(first.id, "one, edited")
    assert [(m.role, m.content) for m in store.messages(conv.id)] == [("user", "one, edited")]
    # New messages continue after the kept ones.
    assert store.add_message(conv.id, "assistant", "D").position == 1
    store.truncate_from(store.messages(conv.id)[1].id)
    assert len(store.messages(conv.id)) == 1


def test_store_survives_a_crash_between_messages(tmp_path):
    """A process that dies without closing keeps every committed message."""
    path = tmp_path / "chats.sqlite3"
    script = textwrap.dedent(f"""
        import os
        from kvscope.app.desktop.chat.store import ChatStore
        s = ChatStore({str(path)!r})
        c = s.create_conversation("crash")
        s.add_message(c.id, "user", "hello")
        s.add_message(c.id, "assistant", "hi")
        s.add_message(c.id, "user", "still there?")
        os._exit(1)  # the reply to the last message was in flight
    """)
    root = str(REPO)
    done = subprocess.run([sys.executable, "-c", script], cwd=root, timeout=60)
    assert done.returncode == 1
    store = ChatStore(path)
    [conv] = store.conversations()
    assert [m.content for m in store.messages(conv.id)] == ["hello", "hi", "still there?"]
    store.close()


# ---- fitting a conversation into the context ------------------------------------------------
def _engine_like(tokenizer, limit):
    """The three things fit_conversation asks of an engine, without building one."""
    return SimpleNamespace(
        max_seq_len=limit,
        max_model_len=limit,
        tokenize=lambda text: (text, tokenizer.encode(text, add_special_tokens=False)),
        apply_chat_template=lambda messages: tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        ),
    )


def _turns(n):
    turns = []
    for i in range(n):
        turns.append({"role": "user", "content": f"Question {i}: tell me about the number {i}."})
        turns.append({"role": "assistant", "content": f"The number {i} is a fine number. " * 3})
    return turns + [{"role": "user", "content": "And the last question?"}]


def test_overflow_drop_oldest_keeps_system_prompt_and_newest_turn(default_model):
    tokenizer = default_model.tokenizer
    turns = _turns(4)
    full, dropped = fit_conversation(
        _engine_like(tokenizer, 8192), "SYSTEM-RULES", turns, 8, "stop"
    )
    assert dropped == 0
    small = _engine_like(tokenizer, len(full) - 20)
    ids, dropped = fit_conversation(small, "SYSTEM-RULES", turns, 8, "drop_oldest")
    assert dropped >= 1 and len(ids) + 8 <= small.max_seq_len
    text = tokenizer.decode(ids)
    assert "SYSTEM-RULES" in text and "And the last question?" in text
    assert "Question 0" not in text
    with pytest.raises(ContextOverflow, match="context is full"):
        fit_conversation(small, "SYSTEM-RULES", turns, 8, "stop")
    with pytest.raises(ContextOverflow, match="newest message alone"):
        fit_conversation(_engine_like(tokenizer, 40), "", turns, 8, "drop_oldest")


# ---- the window ------------------------------------------------------------------------------
def test_chat_streams_persists_and_survives_a_restart(make_window, qtbot, tmp_path):
    window = make_window()
    updates = []
    window.chats.reply_updated.connect(updates.append)
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS) as done:
        cid = window.chats.send_message("What is the **capital** of `France`?")
        # Crash safety: the user message is on disk already, the reply is not.
        other = ChatStore(window.store.path)
        assert [m.role for m in other.messages(cid)] == ["user"]
        other.close()
    assert done.args == [cid, "complete"]
    assert sum(not u.finished for u in updates) >= 2  # it streamed
    user, reply = window.store.messages(cid)
    assert reply.role == "assistant" and reply.content == updates[-1].texts[0]
    assert reply.metrics["prompt_tokens"] > 0 and reply.metrics["ttft_s"] is not None
    bubbles = window.chat.bubbles()
    assert [b.body.markdown() for b in bubbles] == [user.content, reply.content]
    assert "TTFT" in bubbles[1].metrics.text()
    window.close()

    again = make_window()
    assert again.chats.current_id == cid
    assert [b.body.markdown() for b in again.chat.bubbles()] == [user.content, reply.content]
    # The title is the first message's words, without its markdown.
    assert again.store.conversation(cid).title == "What is the capital of France?"


def test_stop_keeps_the_partial_reply_and_frees_its_blocks(make_window, qtbot):
    window = make_window(max_tokens=400)
    first = []
    window.chats.reply_updated.connect(lambda u: first.append(u) if u.texts[0] else None)
    cid = window.chats.send_message("Write a long story about a dragon.")
    request_id = window.chats.request_id_of(cid)
    qtbot.waitUntil(lambda: bool(first), timeout=TIMEOUT_MS)
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS) as done:
        window.chats.stop(cid)
    assert done.args == [cid, "stopped"]
    reply = window.store.messages(cid)[-1]
    assert reply.status == "stopped" and reply.content.startswith(first[0].texts[0])

    def freed():
        t = window.last_telemetry
        return t is not None and t.stats["num_running"] == 0 and t.paged is not None

    qtbot.waitUntil(freed, timeout=TIMEOUT_MS)
    snap = window.last_telemetry.paged
    # A sequence finished this step may stay listed as finished; it owns no block either way.
    assert all(s.status == "finished" for s in snap.sequences if s.request_id == request_id)
    assert not (snap.state == BlockState.USED).any()
    assert window.last_telemetry.stats["kv_blocks_used"] == 0


def test_two_chats_are_batched_together(make_window, qtbot):
    window = make_window(max_tokens=8)
    seen_together = []

    def watch(t):
        if t.paged is not None:
            groups = {group_of(s.request_id) for s in t.paged.sequences}
            seen_together.append(len(groups))

    window.telemetry_received.connect(watch)
    finished = []
    window.chats.reply_finished.connect(lambda cid, status: finished.append(cid))
    a = window.chats.send_message("Name a colour.", window.chats.new_conversation())
    b = window.chats.send_message("Name an animal.", window.chats.new_conversation())
    assert {group_of(window.chats.request_id_of(a)), group_of(window.chats.request_id_of(b))} == {
        f"conv-{a}",
        f"conv-{b}",
    }
    qtbot.waitUntil(lambda: len(finished) == 2, timeout=TIMEOUT_MS)
    assert max(seen_together) == 2
    assert window.store.messages(a)[-1].role == window.store.messages(b)[-1].role == "assistant"


def test_edit_and_resend_replaces_the_later_messages(make_window, qtbot):
    window = make_window(max_tokens=4)
    cid = window.chats.new_conversation()
    window.store.add_message(cid, "user", "Say hello.")
    for role, text in (("assistant", "Hello!"), ("user", "Say goodbye."), ("assistant", "Bye!")):
        window.store.add_message(cid, role, text)
    window.chats.open_conversation(cid)
    assert len(window.chat.bubbles()) == 4
    window.chat.bubbles()[0].edit.click()  # as a user does: Edit, change the text, Send
    assert window.chat.composer.toPlainText() == "Say hello."
    window.chat.composer.setPlainText("Say hi.")
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS):
        window.chat.send.click()
    msgs = window.store.messages(cid)
    assert [(m.role, m.position) for m in msgs] == [("user", 0), ("assistant", 1)]
    assert msgs[0].content == "Say hi." and msgs[1].content != "Hello!"
    assert len(window.chat.bubbles()) == 2


def test_n_samples_show_as_alternatives(make_window, qtbot):
    window = make_window(max_tokens=4, n=2, temperature=1.0, seed=3)
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS):
        cid = window.chats.send_message("Pick a random word.")
    reply = window.store.messages(cid)[-1]
    assert len(reply.alternatives) == 2 and reply.content == reply.alternatives[0]
    bubble = window.chat.bubbles()[-1]
    assert bubble.alt_label.text() == "1/2" and bubble.next_alt.isEnabled()
    bubble.next_alt.click()
    assert window.store.messages(cid)[-1].selected == 1
    assert window.chat.bubbles()[-1].body.markdown() == reply.alternatives[1]
    # The bubble counts the tokens of the sample it shows, not of both.
    per_sample = reply.metrics["sample_tokens"]
    assert len(per_sample) == 2 and sum(per_sample) == reply.metrics["generated_tokens"]
    shown = window.chat.bubbles()[-1].metrics.text()
    assert re.search(rf"· {per_sample[1]} tok(?: ·|$)", shown), shown


def test_a_conversation_past_max_model_len_stops_with_a_message(make_window, qtbot):
    window = make_window(max_model_len=40, max_tokens=4)
    with qtbot.waitSignal(window.chats.reply_failed, timeout=TIMEOUT_MS) as failed:
        cid = window.chats.send_message("Tell me everything about the history of tea. " * 4)
    assert "context is full" in failed.args[1]
    assert window.chat.notice.isVisibleTo(window) and "context is full" in window.chat.notice.text()
    assert [m.role for m in window.store.messages(cid)] == ["user"]  # kept, can be retried
    assert cid not in window.chats.pending


def test_block_contents_reach_the_map_through_the_worker(make_window, qtbot, monkeypatch):
    window = make_window(max_tokens=4)
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS):
        window.chats.send_message("Name three rivers in Europe, please.")
    qtbot.waitUntil(lambda: window.last_telemetry.stats["num_running"] == 0, timeout=TIMEOUT_MS)
    snap = window.last_telemetry.paged
    cached = [int(b) for b in (snap.state == BlockState.CACHED).nonzero()[0]]
    assert cached, "the finished prompt's full blocks stay cached"
    answers = []
    monkeypatch.setattr(window.blockmap, "show_block_info", lambda b, info: answers.append(info))
    window.blockmap._info_provider(cached[0])  # what the panel calls when a block is hovered
    qtbot.waitUntil(lambda: bool(answers), timeout=TIMEOUT_MS)
    assert answers[0]["block_id"] == cached[0] and answers[0]["state"] == "cached"
    assert len(answers[0]["token_ids"]) == snap.block_size and answers[0]["text"]


def test_simulated_users_share_the_engine_with_chats(make_window, qtbot):
    from kvscope.app.desktop.simulated_users.loadgen import LoadSpec

    window = make_window(max_tokens=4)
    spec = LoadSpec(
        num_users=2,
        prompt_tokens=(24, 32),
        output_tokens=(3, 4),
        shared_system_prompt=False,
        arrival_rate_per_s=50.0,
        seed=1,
    )
    window.loadgen_panel.set_spec(spec)
    window.loadgen_panel.start.click()

    def finished_load_requests():
        match = re.search(r"(\d+) done", window.loadgen_panel.status.text())
        return int(match.group(1)) if match else 0

    qtbot.waitUntil(lambda: finished_load_requests() >= 2, timeout=TIMEOUT_MS)
    window.loadgen_panel.stop.click()
    qtbot.waitUntil(lambda: "stopped" in window.loadgen_panel.status.text(), timeout=TIMEOUT_MS)
    assert not window.loadgen_panel.stop.isEnabled()
    qtbot.waitUntil(lambda: window.last_telemetry.stats["kv_blocks_used"] == 0, timeout=TIMEOUT_MS)
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS) as done:
        cid = window.chats.send_message("Still there?")
    assert done.args == [cid, "complete"]


def test_regenerate_uses_the_system_prompt_and_replaces_the_reply(make_window, qtbot):
    window = make_window(max_tokens=3, temperature=1.0)
    other = window.chats.new_conversation()
    cid = window.chats.new_conversation()
    window.chat.system_toggle.setChecked(True)
    window.chat.system_prompt.setPlainText("You answer in French.")
    window.chats.open_conversation(other)  # switching away saves the edit, to its own chat
    assert window.store.conversation(cid).system_prompt == "You answer in French."
    assert window.store.conversation(other).system_prompt == ""
    window.chats.open_conversation(cid)
    assert window.chat.system_prompt.toPlainText() == "You answer in French."
    submitted = []
    real_submit = window.client.submit
    window.client.submit = lambda *args: (submitted.append(args), real_submit(*args))
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS):
        window.chats.send_message("Hello!", cid)
    first = window.store.messages(cid)[-1]
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS):
        window.chat.bubbles()[-1].regenerate.click()
    msgs = window.store.messages(cid)
    assert [m.role for m in msgs] == ["user", "assistant"]
    # The new reply is shown; the first is kept as its alternative (issue 29).
    assert msgs[1].id == first.id and msgs[1].selected == 1
    assert msgs[1].alternatives[0] == first.content and len(msgs[1].alternatives) == 2
    assert [args[1] for args in submitted] == ["You answer in French."] * 2
    assert submitted[0][0] != submitted[1][0]  # a fresh request id each time
    assert all(args[0].startswith(f"conv-{cid}/") for args in submitted)


def test_closing_mid_reply_keeps_it_stopped_and_deleting_a_chat_stops_it(
    make_window, qtbot, tmp_path
):
    window = make_window(max_tokens=400)
    chats = window.chats
    keep = chats.send_message("Tell me a very long story.", chats.new_conversation())
    gone = chats.send_message("Tell me another long story.", chats.new_conversation())
    qtbot.waitUntil(
        lambda: all(chats.pending[c].texts and chats.pending[c].texts[0] for c in (keep, gone)),
        timeout=TIMEOUT_MS,
    )
    chats.delete_conversation(gone)
    assert gone not in chats.pending and [c.id for c in window.store.conversations()] == [keep]
    partial = chats.pending[keep].texts[0]
    window.close()
    store = ChatStore(tmp_path / "chats.sqlite3")
    reply = store.messages(keep)[-1]
    assert reply.status == "stopped" and reply.content.startswith(partial)
    assert store.messages(gone) == []
    store.close()


def test_a_chat_template_that_refuses_the_messages_fails_the_reply(make_window, qtbot):
    window = make_window(max_tokens=4)
    tokenizer = window.client.worker.llm.engine.tokenizer
    original = tokenizer.chat_template
    # Mistral's templates refuse two user turns in a row this way.
    tokenizer.chat_template = "{{ raise_exception('Conversation roles must alternate') }}"
    try:
        with qtbot.waitSignal(window.chats.reply_failed, timeout=TIMEOUT_MS) as failed:
            cid = window.chats.send_message("Hello?")
    finally:
        tokenizer.chat_template = original
    assert "chat template refused" in failed.args[1] and "must alternate" in failed.args[1]
    assert cid not in window.chats.pending  # not stuck "generating": the user can edit and resend
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS):
        window.chats.send_message("Hello again")


def test_a_message_the_disk_cannot_take_stays_in_the_composer(make_window, qtbot, monkeypatch):
    import sqlite3

    window = make_window(max_tokens=4)
    real = window.store.add_message

    def full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(window.store, "add_message", full)
    window.chat.composer.setPlainText("Please remember this.")
    with qtbot.waitSignal(window.error_shown, timeout=TIMEOUT_MS) as shown:
        window.chat._submit()
    assert "disk is full" in shown.args[0]
    assert window.chat.composer.toPlainText() == "Please remember this."  # not lost
    assert not window.chats.pending
    monkeypatch.setattr(window.store, "add_message", real)
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS):
        window.chat._submit()  # the disk has room again: the same text goes out
    assert window.chat.composer.toPlainText() == ""


def test_a_reply_the_disk_cannot_take_does_not_hang_the_chat(make_window, qtbot, monkeypatch):
    import sqlite3

    window = make_window(max_tokens=4)
    real = window.store.add_message

    def full_for_replies(cid, role, *args, **kwargs):
        if role == "assistant":
            raise sqlite3.OperationalError("database or disk is full")
        return real(cid, role, *args, **kwargs)

    monkeypatch.setattr(window.store, "add_message", full_for_replies)
    with qtbot.waitSignal(window.chats.reply_failed, timeout=TIMEOUT_MS) as failed:
        cid = window.chats.send_message("Count to three.")
    assert "disk is full" in failed.args[1] and "The reply was:" in window.last_error
    assert cid not in window.chats.pending and not window.chat._generating
    monkeypatch.setattr(window.store, "add_message", real)
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS):
        window.chats.regenerate(cid)


def test_new_chat_twice_opens_one_empty_chat(make_window, qtbot):
    window = make_window(max_tokens=2)
    button = window.conversations.new_button
    button.click()
    first = window.chats.current_id
    button.click()  # the issue: two clicks made two empty chats
    assert window.chats.current_id == first
    assert [c.id for c in window.store.conversations()].count(first) == 1
    assert len(window.store.conversations()) == 1
    window.chats.send_message("hello", first)
    qtbot.waitUntil(lambda: first not in window.chats.pending, timeout=60_000)
    button.click()  # a chat with a message in it stays; this one is new
    assert window.chats.current_id != first
    assert len(window.store.conversations()) == 2
