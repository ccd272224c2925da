"""Chats over a connection: OpenAIHttp against a real `kvscope serve` on 127.0.0.1 (models,
streamed replies with usage and cached tokens, /tokenize, a stop that aborts on the server,
OpenAI errors and a server that is not there), then the app: a chat switched to the server's
model streams, stops, regenerates and stores its replies like an engine chat, its choice is
kept in SQLite (old databases upgrade), and a chat whose connection is gone says so and keeps
its history."""

from __future__ import annotations

import socket
import sqlite3
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from served import start_server

from kvscope.app.desktop.chat.store import _MIGRATIONS, SCHEMA_VERSION, ChatStore, RemoteTarget
from kvscope.app.remote.connection import parse_connection
from kvscope.app.remote.openai_http import (
    ChatDelta,
    OpenAIHttp,
    RemoteError,
    _chat_deltas,
    _error_text,
)

KEY = "remote-chat-key"
MAX_MODEL_LEN = 256
TIMEOUT_MS = 60_000
LONG = {"max_tokens": 200, "temperature": 1.0, "top_p": 1.0, "seed": 7}


@pytest.fixture(scope="module")
def server(default_model):
    srv = start_server(default_model, 96, MAX_MODEL_LEN, api_key=KEY)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def connection(server):
    return parse_connection(server.base_url, api_key=KEY, name="box")


def _stats(server) -> dict:
    return server.driver.call(lambda e: e.stats()).result(timeout=60)


def _aborted(server) -> float:
    with OpenAIHttp(parse_connection(server.base_url, api_key=KEY)) as http:
        text = http._client.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "vllm:request_success_total"
                and sample.labels.get("finished_reason") == "abort"
            ):
                return sample.value
    raise KeyError("vllm:request_success_total{finished_reason=abort}")


def _wait_idle(server) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = _stats(server)
        if stats["num_running"] == 0 and stats["kv_blocks_used"] == 0:
            return stats
        time.sleep(0.1)
    return _stats(server)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- OpenAIHttp ------------------------------------------------------------------------------
def test_models_stream_usage_cached_tokens_and_tokenize(server, connection):
    messages = [
        {"role": "system", "content": "You are a terse assistant who answers in one line."},
        {"role": "user", "content": "Name a colour."},
    ]
    params = {"max_tokens": 8, "temperature": 0.0, "top_k": -1, "min_p": 0.0, "n": 1}
    with OpenAIHttp(connection) as http:
        assert http.models() == [server.model_name]
        prompt = http.tokenize(server.model_name, messages=messages)
        counted = http.count_tokens(server.model_name, messages=messages)
        replies = []
        for _ in range(2):
            deltas = list(http.stream_chat(server.model_name, messages, params))
            text = "".join(d.text for d in deltas)
            [finish] = [d.finish_reason for d in deltas if d.finish_reason]
            [usage] = [d for d in deltas if d.prompt_tokens is not None]
            replies.append((text, finish, usage))
        two = list(http.stream_chat(server.model_name, messages, {**LONG, "max_tokens": 4, "n": 2}))
    assert counted.count == len(prompt) > 16 and counted.max_model_len == MAX_MODEL_LEN
    (first, finish, usage), (again, _, usage_again) = replies
    assert first and again == first  # greedy: the same reply twice
    assert finish in ("stop", "length")
    assert usage.prompt_tokens == usage_again.prompt_tokens == len(prompt)
    assert usage.completion_tokens >= 1
    assert {d.index for d in two if d.text} == {0, 1}  # n=2: both samples stream
    assert sorted(d.index for d in two if d.finish_reason) == [0, 1]
    # The second time the prompt's full blocks come from the server's prefix cache.
    assert usage_again.cached_tokens >= 16 and usage_again.cached_tokens > usage.cached_tokens


def test_closing_the_stream_aborts_the_request_on_the_server(server, connection):
    aborted_before = _aborted(server)
    messages = [{"role": "user", "content": "Write a very long story about a dragon."}]
    with OpenAIHttp(connection) as http:
        stream = http.stream_chat(server.model_name, messages, LONG)
        got = [d for _, d in zip(range(3), stream, strict=False)]
        assert all(d.text for d in got[1:]) and _stats(server)["num_running"] == 1
        stream.close()
    stats = _wait_idle(server)
    assert (stats["num_running"], stats["kv_blocks_used"]) == (0, 0)
    assert _aborted(server) == aborted_before + 1


def test_abort_from_another_thread_cuts_the_stream_being_read(server, connection):
    """What Stop does in the app: the GUI thread cuts the stream its reader thread blocks on."""
    aborted_before = _aborted(server)
    messages = [{"role": "user", "content": "Tell me about the sea, at length."}]
    http = OpenAIHttp(connection)
    started, outcome = threading.Event(), []

    def read() -> None:
        try:
            for delta in http.stream_chat(server.model_name, messages, LONG):
                if delta.text:
                    started.set()
            outcome.append("finished")
        except RemoteError as e:
            outcome.append(str(e))

    reader = threading.Thread(target=read)
    reader.start()
    assert started.wait(30)
    http.abort()
    reader.join(10)
    assert not reader.is_alive() and outcome == [f"box ({server.base_url}): the reply was stopped"]
    stats = _wait_idle(server)
    assert stats["num_running"] == 0 and _aborted(server) == aborted_before + 1
    http.close()


def test_errors_name_the_server_and_say_what_went_wrong(server, connection):
    wrong_key = parse_connection(server.base_url, api_key="nope", name="box")
    with OpenAIHttp(wrong_key) as http, pytest.raises(RemoteError) as refused:
        http.models()
    assert "box" in str(refused.value) and "HTTP 401" in str(refused.value)
    assert "invalid API key" in str(refused.value)
    with OpenAIHttp(connection) as http, pytest.raises(RemoteError) as unknown:
        list(http.stream_chat("no-such-model", [{"role": "user", "content": "hi"}], {}))
    assert "HTTP 404" in str(unknown.value) and "no-such-model" in str(unknown.value)
    with OpenAIHttp(connection) as http, pytest.raises(RemoteError) as too_long:
        list(
            http.stream_chat(
                server.model_name,
                [{"role": "user", "content": "hi"}],
                {"max_tokens": MAX_MODEL_LEN * 2},
            )
        )
    assert "HTTP 400" in str(too_long.value) and "max_tokens" in str(too_long.value)
    down = parse_connection(f"127.0.0.1:{_free_port()}", name="gone")
    with OpenAIHttp(down, timeout=5) as http, pytest.raises(RemoteError) as nobody:
        http.models()
    message = str(nobody.value)
    assert message.startswith("cannot connect to gone") and "Is it running?" in message


def test_server_sent_events_as_vllm_streams_them_and_broken_ones():
    lines = [
        ": keep-alive",
        'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":null}',
        "",
        'data: {"choices":[{"index":1,"delta":{"content":"B"},"finish_reason":null}]}',
        'data: {"choices":[{"index":0,"delta":{"content":"A"},"finish_reason":"length"}]}',
        'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,'
        '"prompt_tokens_details":{"cached_tokens":8}}}',
        "data: [DONE]",
    ]
    deltas = list(_chat_deltas(iter(lines), "box"))
    assert [(d.index, d.text, d.finish_reason) for d in deltas[:2]] == [
        (1, "B", None),
        (0, "A", "length"),
    ]
    assert (deltas[2].prompt_tokens, deltas[2].cached_tokens, deltas[2].completion_tokens) == (
        9,
        8,
        2,
    )
    with pytest.raises(RemoteError, match="box failed the reply mid-stream: out of blocks"):
        list(_chat_deltas(iter(['data: {"error": {"message": "out of blocks"}}']), "box"))
    with pytest.raises(RemoteError, match="before \\[DONE\\]: the reply is cut off"):
        list(_chat_deltas(iter(lines[:4]), "box"))
    with pytest.raises(RemoteError, match="not JSON"):
        list(_chat_deltas(iter(["data: {oops"]), "box"))
    # Error bodies: OpenAI's, vLLM's older flat one, and a proxy's HTML page.
    openai_body = httpx.Response(400, json={"error": {"message": "bad temperature"}})
    vllm_body = httpx.Response(400, json={"object": "error", "message": "too long", "code": 400})
    proxy = httpx.Response(502, text="<html>Bad Gateway</html>")
    assert [_error_text(r) for r in (openai_body, vllm_body, proxy)] == [
        "bad temperature",
        "too long",
        "<html>Bad Gateway</html>",
    ]


# ---- the store ---------------------------------------------------------------------------------
def test_a_version_2_database_upgrades_and_keeps_a_chats_model(tmp_path):
    path = tmp_path / "chats.sqlite3"
    db = sqlite3.connect(path)
    for migration in _MIGRATIONS[:2]:
        db.executescript(migration)
    db.execute(
        "INSERT INTO conversations (title, system_prompt, created_at, updated_at, sampling) "
        "VALUES ('Old chat', '', 1.0, 1.0, '{\"temperature\": 0.5}')"
    )
    db.execute("PRAGMA user_version = 2")
    db.commit()
    db.close()
    store = ChatStore(path)
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    [old] = store.conversations()
    assert (old.title, old.sampling, old.remote) == ("Old chat", {"temperature": 0.5}, None)
    target = RemoteTarget("box", "SmolLM2")
    store.set_remote(old.id, target)
    bound = store.create_conversation("On the box", remote=target)
    store.close()
    again = ChatStore(path)
    assert again.conversation(old.id).remote == target == again.conversation(bound.id).remote
    assert again.conversation(old.id).remote.label == "box · SmolLM2"
    again.set_remote(old.id, None)
    assert again.conversation(old.id).remote is None
    assert [c.title for c in again.conversations()][0] == "On the box"  # no reordering
    again.close()


# ---- the app -----------------------------------------------------------------------------------
def _choose(window, qtbot, target: RemoteTarget) -> None:
    """Pick `target` in the chat's model picker, as a user would (once it is listed)."""
    picker = window.chat.backend_picker
    qtbot.waitUntil(lambda: picker.offers(target), timeout=TIMEOUT_MS)
    assert picker.isVisible()
    index = next(i for i in range(picker.count()) if picker.itemText(i) == target.label)
    picker.setCurrentIndex(index)
    picker.activated.emit(index)


def test_a_chat_on_a_connection_streams_stops_regenerates_and_is_stored(
    make_window, qtbot, server, connection
):
    window = make_window()
    chats = window.chats
    picker = window.chat.backend_picker
    assert not picker.isVisible()  # no connection: the chat looks as it always did
    window.connections.add(connection)
    target = RemoteTarget("box", server.model_name)
    cid = chats.new_conversation()
    _choose(window, qtbot, target)
    assert window.store.conversation(cid).remote == target
    # The context meter counts with the server's /tokenize and its context length.
    window.chat.composer.setPlainText("Say hello.")
    qtbot.waitUntil(
        lambda: window.chat.context_meter.text().endswith(f"/ {MAX_MODEL_LEN} tokens"),
        timeout=TIMEOUT_MS,
    )

    with qtbot.waitSignal(chats.reply_finished, timeout=TIMEOUT_MS) as finished:
        chats.send_message("Say hello.")
    assert finished.args == [cid, "complete"]
    user, reply = window.store.messages(cid)
    assert reply.role == "assistant" and reply.content and reply.status == "complete"
    assert reply.metrics["served_by"] == target.label
    assert reply.metrics["prompt_tokens"] > 0 and reply.metrics["generated_tokens"] >= 1
    assert "via box · " in window.chat.bubbles()[-1].metrics.text()

    # Stop mid-reply: the partial text is kept as stopped, and the server aborts the request.
    window.store.set_sampling(cid, LONG)
    aborted_before = _aborted(server)
    with qtbot.waitSignal(chats.reply_updated, timeout=TIMEOUT_MS):
        chats.regenerate()
    assert chats.pending[cid].client is not window.client
    with qtbot.waitSignal(chats.reply_finished, timeout=TIMEOUT_MS) as stopped:
        chats.stop_current()
    assert stopped.args == [cid, "stopped"]
    assert [m.role for m in window.store.messages(cid)] == ["user", "assistant"]
    assert window.store.messages(cid)[-1].status == "stopped"
    stats = _wait_idle(server)
    assert stats["num_running"] == 0 and _aborted(server) == aborted_before + 1

    # Regenerate replaces the stopped reply with a whole one.
    window.store.set_sampling(cid, {"max_tokens": 6, "temperature": 0.0})
    with qtbot.waitSignal(chats.reply_finished, timeout=TIMEOUT_MS) as again:
        chats.regenerate()
    assert again.args == [cid, "complete"]
    messages = window.store.messages(cid)
    assert [m.role for m in messages] == ["user", "assistant"] and messages[0].id == user.id
    assert messages[-1].status == "complete"


def test_a_chat_whose_connection_is_gone_says_so_and_keeps_its_history(
    make_window, qtbot, tmp_path
):
    # A chat stored as running on a connection this session does not have.
    store = ChatStore(tmp_path / "chats.sqlite3")
    target = RemoteTarget("old-box:8000", "Llama-3")
    conv = store.create_conversation("Remote chat", remote=target)
    store.add_message(conv.id, "user", "Hi there")
    store.add_message(conv.id, "assistant", "Hello!")
    store.close()

    window = make_window()
    window.chats.open_conversation(conv.id)
    picker = window.chat.backend_picker
    assert picker.isVisible() and picker.currentText() == f"{target.label} (not connected)"
    assert "old-box:8000 is not connected" in window.chat.notice.text()
    assert window.chat.notice.isVisible()
    assert [b.body.markdown() for b in window.chat.bubbles()] == ["Hi there", "Hello!"]
    qtbot.waitUntil(lambda: "unknown" in window.chat.context_meter.text(), timeout=TIMEOUT_MS)

    with qtbot.waitSignal(window.chats.reply_failed, timeout=TIMEOUT_MS) as failed:
        window.chats.send_message("Still there?")
    assert "not connected" in failed.args[1]
    assert [m.content for m in window.store.messages(conv.id)] == [
        "Hi there",
        "Hello!",
        "Still there?",
    ]
    assert window.store.conversation(conv.id).remote == target  # the choice is kept
    # Back on this engine, the same chat answers again.
    index = picker.findText("This engine")
    picker.setCurrentIndex(index)
    picker.activated.emit(index)
    assert window.store.conversation(conv.id).remote is None
    assert not window.chat.notice.isVisible()
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS) as done:
        window.chats.regenerate()
    assert done.args == [conv.id, "complete"]


def test_a_delta_for_an_absurd_sample_index_is_dropped():
    """A broken server's `index` must not grow the reply's lists to that size."""
    from kvscope.app.remote.remote_chat_qt import _Reply

    reply = _Reply("r1", 1, "a · m")
    assert reply.apply(ChatDelta(index=10**9, text="x", finish_reason="stop")) is False
    assert reply.apply(ChatDelta(index=-1, text="y")) is False
    reply.apply(ChatDelta(index=0, text="ok"))
    assert reply.texts == ["ok"] and len(reply.reasons) == 1
