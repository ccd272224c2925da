"""A served model's chat template and long prompts cannot stall the server (issue 27, items 3
and 4): templates render off the event loop within their budget, and a long prompt is
tokenized in the tokenizing pool, never on the event loop or in the engine thread."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from served import start_server
from template_bombs import CONCAT_LOOP, NESTED_LOOP, peak_rss_during

ENGINE_THREAD = "kvscope-serve-engine"


@pytest.fixture(scope="module")
def server(default_model):
    srv = start_server(default_model, 64, 1024)
    yield srv
    srv.stop()


@pytest.fixture()
def template(server):
    """Set the served model's chat template for one test (restored after)."""
    tokenizer = server.state.engine.tokenizer
    original = tokenizer.chat_template

    def set_template(source: str) -> None:
        tokenizer.chat_template = source

    yield set_template
    tokenizer.chat_template = original


def _chat(srv, content: str = "Hi", timeout: float = 60, **extra) -> httpx.Response:
    body = {"model": srv.model_name, "messages": [{"role": "user", "content": content}]}
    return httpx.post(
        f"{srv.base_url}/v1/chat/completions",
        json=body | {"max_tokens": 2} | extra,
        timeout=timeout,
    )


def test_a_looping_template_fails_its_request_while_the_server_keeps_serving(server, template):
    template(NESTED_LOOP)
    answers: dict = {}

    def chat():
        start = time.monotonic()
        answers["chat"] = _chat(server)
        answers["chat_s"] = time.monotonic() - start

    def completion():
        body = {"model": server.model_name, "prompt": "Once upon a time", "max_tokens": 16}
        answers["completion"] = httpx.post(
            f"{server.base_url}/v1/completions", json=body | {"ignore_eos": True}, timeout=60
        )

    threads = [threading.Thread(target=chat), threading.Thread(target=completion)]
    for t in threads:
        t.start()
    health = []
    while threads[0].is_alive():
        start = time.monotonic()
        assert httpx.get(f"{server.base_url}/health", timeout=30).status_code == 200
        health.append(time.monotonic() - start)
        time.sleep(0.05)
    for t in threads:
        t.join(timeout=60)
    reply = answers["chat"]
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "messages" and "time budget of 2 s" in error["message"]
    assert answers["chat_s"] < 20  # unbounded, the template would loop for hours
    assert answers["completion"].status_code == 200, answers["completion"].text
    assert len(health) >= 5 and max(health) < 1.0, health
    # The same template through /tokenize: the same bounded path, the same 400.
    tokenize = httpx.post(
        f"{server.base_url}/tokenize",
        json={"messages": [{"role": "user", "content": "Hi"}]},
        timeout=60,
    )
    assert tokenize.status_code == 400 and "time budget" in tokenize.json()["error"]["message"]


@pytest.mark.parametrize("source", ["{{ 'x' * 3000000000 }}", CONCAT_LOOP])
def test_a_ballooning_template_gets_a_400_without_the_memory(server, template, source):
    template(source)
    replies = []

    def ask():
        replies.append(_chat(server))
        replies.append(
            httpx.post(
                f"{server.base_url}/tokenize",
                json={"messages": [{"role": "user", "content": "Hi"}]},
                timeout=60,
            )
        )

    assert peak_rss_during(ask) < 100 << 20
    for reply in replies:
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == "messages" and "memory budget" in error["message"]
    template("{{ messages[0]['content'] }}")  # the server goes on with a sane template
    assert _chat(server).status_code == 200


@pytest.fixture()
def encode_threads(server):
    """(thread name, characters) of every tokenizer encode while a test runs."""
    tokenizer = server.state.engine.tokenizer
    original = tokenizer.encode
    seen: list[tuple[str, int]] = []

    def spy(text, *args, **kwargs):
        seen.append((threading.current_thread().name, len(text)))
        return original(text, *args, **kwargs)

    tokenizer.encode = spy
    yield seen
    del tokenizer.encode  # the class's method again


def test_a_long_legal_prompt_is_not_tokenized_in_the_engine_thread(server, encode_threads):
    chars = server.state.max_prompt_chars - 10  # just under the bound: it must be tokenized
    prompt = ("word " * (chars // 5 + 1))[:chars]
    completion = httpx.post(
        f"{server.base_url}/v1/completions",
        json={"model": server.model_name, "prompt": prompt, "max_tokens": 2},
        timeout=60,
    )
    assert completion.status_code == 400  # more tokens than max_model_len: refused, after
    assert "max_model_len" in completion.json()["error"]["message"]
    chat = _chat(server, prompt[: chars - 200])
    assert chat.status_code == 400
    long_ones = [(name, n) for name, n in encode_threads if n > chars // 2]
    assert len(long_ones) == 2, encode_threads
    assert all(name.startswith("kvscope-tokenize") for name, _ in long_ones), long_ones
    assert all(name != ENGINE_THREAD for name, _ in encode_threads)


def test_another_stream_keeps_its_pace_while_a_long_prompt_is_tokenized(server, encode_threads):
    """A 2M-character prompt with truncate_prompt_tokens is legitimate: cut and tokenized. A
    stream running meanwhile gets its tokens at its own pace."""
    arrivals: list[float] = []
    started, done = threading.Event(), threading.Event()

    def stream():
        body = {
            "model": server.model_name,
            "prompt": "Count with me: one, two,",
            "max_tokens": 900,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream(
            "POST", f"{server.base_url}/v1/completions", json=body, timeout=120
        ) as reply:
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    arrivals.append(time.monotonic())
                    if len(arrivals) == 5:
                        started.set()
                    if done.is_set() and arrivals[-1] > done_at[0] + 0.5:
                        break  # closing the stream aborts the rest

    done_at = [0.0]
    streamer = threading.Thread(target=stream)
    streamer.start()
    assert started.wait(60)
    begin = time.monotonic()
    long = httpx.post(
        f"{server.base_url}/v1/completions",
        json={
            "model": server.model_name,
            "prompt": "lorem ipsum dolor sit amet " * 75_000,
            "max_tokens": 2,
            "truncate_prompt_tokens": 8,
        },
        timeout=120,
    )
    end = time.monotonic()
    done_at[0] = end
    done.set()
    streamer.join(timeout=120)
    assert long.status_code == 200, long.text
    assert long.json()["usage"]["prompt_tokens"] == 8
    # Cut by characters before tokenizing (tests/app/serve/test_serve_truncation.py), then
    # tokenized in the pool, never in the engine thread.
    tokenized = [(name, n) for name, n in encode_threads if n > 1_000]
    assert tokenized and all(name.startswith("kvscope-tokenize") for name, _ in tokenized)
    during = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False) if begin <= b <= end]
    assert arrivals[-1] > end, "the stream ended before the long prompt was done"
    # Tokenizing it in the engine thread held every stream for the whole time (~2 s here).
    assert during and max(during) < 1.0, (max(during), end - begin)
