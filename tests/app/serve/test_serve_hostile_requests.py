"""Requests built to hurt (issue: hostile clients, round 2): each is refused with the status and
the bounded message promised, and leaves nothing behind in the server."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlparse

import httpx
import pytest
from served import start_server

from kvscope.app.serve.guards import MAX_BODY_BYTES
from kvscope.app.serve.protocol import MAX_STOP_CHARS, MAX_STOP_STRINGS


@pytest.fixture(scope="module")
def server(default_model):
    srv = start_server(default_model, 64, 256)
    yield srv
    srv.stop()


def _post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{srv.base_url}{path}", json=body, timeout=60)


def test_stop_strings_are_bounded_in_count_and_length(server):
    base = {"model": server.model_name, "prompt": "Hello", "max_tokens": 2}
    for stop in (["a"] * (MAX_STOP_STRINGS + 1), "x" * (MAX_STOP_CHARS + 1), [""]):
        reply = _post(server, "/v1/completions", base | {"stop": stop})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"].startswith("stop")
    # The message names the bound broken, not the union branch that did not match.
    too_many = _post(server, "/v1/completions", base | {"stop": ["a"] * 250})
    assert f"at most {MAX_STOP_STRINGS} items" in too_many.json()["error"]["message"]
    as_bools = _post(server, "/v1/completions", base | {"prompt": [True, 1]})
    assert as_bools.status_code == 400
    assert "should be string, list of strings, list of integers" in as_bools.text
    ok = _post(server, "/v1/completions", base | {"stop": ["a"] * MAX_STOP_STRINGS})
    assert ok.status_code == 200, ok.text


def test_a_chunked_body_over_the_limit_gets_413(server):
    url = urlparse(server.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.putrequest("POST", "/v1/completions")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    chunk = b"x" * (1 << 20)
    try:
        for _ in range(MAX_BODY_BYTES // len(chunk) + 2):
            conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        conn.send(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may answer and close before the rest is sent
    reply = conn.getresponse()
    assert reply.status == 413
    assert "over the limit" in json.loads(reply.read())["error"]["message"]
    conn.close()
    assert _post(server, "/tokenize", {"prompt": "still serving"}).status_code == 200


def test_a_405_says_what_is_allowed(server):
    reply = httpx.get(f"{server.base_url}/v1/completions", timeout=30)
    assert reply.status_code == 405 and reply.headers["allow"] == "POST"


def test_a_huge_unknown_model_name_is_not_echoed(server):
    reply = _post(server, "/v1/completions", {"model": "m" * (1 << 20), "prompt": "x"})
    assert reply.status_code == 404
    message = reply.json()["error"]["message"]
    assert len(message) < 400 and "1,048,576 characters" in message


def test_refused_requests_leave_no_tracked_metrics(server):
    def tracked() -> int:
        return server.driver.call(lambda _: server.metrics.num_tracked).result(timeout=30)

    before = tracked()
    too_long = {"model": server.model_name, "prompt": "word " * 400, "max_tokens": 2}
    for _ in range(20):  # refused by the engine: the prompt does not fit max_model_len
        assert _post(server, "/v1/completions", too_long).status_code == 400
    assert tracked() == before


def test_a_prompt_that_cannot_fit_is_refused_before_tokenizing(server):
    engine = server.driver.engine
    seen: list[int] = []
    original = engine.tokenize

    def spy(prompt):
        seen.append(len(prompt))
        return original(prompt)

    engine.tokenize = spy
    try:
        huge = "lorem ipsum " * 350_000  # 4.2 M characters, refused anyway
        for path, body in (
            ("/v1/completions", {"prompt": huge[:3_900_000]}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": huge[:4_000_000]}]}),
        ):
            reply = _post(server, path, {"model": server.model_name, "max_tokens": 2} | body)
            assert reply.status_code == 400, reply.text
            assert "characters: more than 256 tokens" in reply.json()["error"]["message"]
        # /tokenize counts only what could be sent: the same bound, before its tokenizer runs.
        for body in (
            {"prompt": huge[:3_900_000]},
            {"messages": [{"role": "user", "content": huge[:4_000_000]}]},
        ):
            reply = _post(server, "/tokenize", body)
            assert reply.status_code == 400, reply.text
            assert "characters: more than 256 tokens" in reply.json()["error"]["message"]
        assert all(n < 100_000 for n in seen), seen  # none of them reached the tokenizer
        # With truncate_prompt_tokens the long prompt is legitimate: it is tokenized and cut.
        ok = _post(
            server,
            "/v1/completions",
            {"model": server.model_name, "prompt": huge[:200_000], "max_tokens": 1}
            | {"truncate_prompt_tokens": 32},
        )
        assert ok.status_code == 200, ok.text
    finally:
        engine.tokenize = original
