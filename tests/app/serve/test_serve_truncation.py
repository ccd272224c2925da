"""truncate_prompt_tokens on a long prompt (issue 43, item 4): the prompt is cut by characters
before it is tokenized, so a 3.9 MB prompt costs the tokenizing pool what the kept tokens cost,
and the tokens kept are the whole prompt's own (the side asked for, through the chat template
too)."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from served import start_server

from kvscope.app.serve.truncation import CUT_MARGIN_TOKENS

ENGINE_THREAD = "kvscope-serve-engine"


@pytest.fixture(scope="module")
def server(default_model):
    srv = start_server(default_model, 48, 256)
    yield srv
    srv.stop()


@pytest.fixture()
def encodes(server):
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


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)


def test_a_giant_truncated_prompt_is_cut_before_the_tokenizer_sees_it(server, encodes):
    huge = ("lorem ipsum dolor sit amet " * 150_000)[:3_900_000]
    client = _client(server)
    keep = 8
    bound = (keep + CUT_MARGIN_TOKENS) * server.state.longest_token_chars
    for side in ("left", "right"):
        extra = {"truncate_prompt_tokens": keep, "truncation_side": side}
        completion = client.completions.create(
            model=server.model_name, prompt=huge, max_tokens=1, extra_body=extra
        )
        assert completion.usage.prompt_tokens == keep
        chat = client.chat.completions.create(
            model=server.model_name,
            messages=[{"role": "user", "content": huge}],
            max_tokens=1,
            extra_body=extra,
        )
        assert chat.usage.prompt_tokens == keep
    assert len(encodes) == 4, encodes
    # Uncut, each of them was 3.9 M characters in the tokenizing pool (seconds each).
    assert all(n <= bound for _, n in encodes), (bound, encodes)
    assert all(name.startswith("kvscope-tokenize") for name, _ in encodes), encodes


def _greedy(server, prompt, **fields) -> tuple[str, int]:
    body = {"model": server.model_name, "prompt": prompt, "max_tokens": 6, "temperature": 0}
    reply = httpx.post(f"{server.base_url}/v1/completions", json=body | fields, timeout=120)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    return answer["choices"][0]["text"], answer["usage"]["prompt_tokens"]


def test_the_cut_keeps_the_whole_prompts_own_tokens(server, encodes):
    """The cut lands mid-word; the margin drops what it split, so the tokens kept are those
    of the whole prompt tokenized, as vLLM keeps them."""
    story = "Once upon a time, a fox named Quill counted 1, 2, 3 stars; then 4.5 more! "
    prompt = story * 2_000 + "The last thing the fox said was"
    whole = server.state.engine.tokenizer.encode(prompt, add_special_tokens=False)
    encodes.clear()
    for side, kept in (("left", whole[-12:]), ("right", whole[:12])):
        cut = _greedy(server, prompt, truncate_prompt_tokens=12, truncation_side=side)
        assert cut == _greedy(server, kept), side
    assert max(n for _, n in encodes) < len(prompt) // 10  # it was cut before tokenizing
