"""What vLLM's sampling fields do through `kvscope serve`, each against the same request without
it (greedy, so that any difference is the field's): ignore_eos, min_tokens, top_k / min_p,
penalties, stop_token_ids and include_stop_str_in_output, skip_special_tokens, logit_bias,
allowed_token_ids, truncate_prompt_tokens. tests/app/serve/test_vllm_sampling.py checks that every
field of vLLM's requests is classified; the sampler's arithmetic is in
tests/engine/model/test_sampler_processors.py."""

from __future__ import annotations

import re

import pytest
from served import start_server
from vllm_requests import post

MAX_MODEL_LEN = 128
# A question the bundled model answers in a few tokens and then ends its turn (EOS) ...
SHORT_ANSWER = "Reply with one word: yes or no?"
# ... and a prompt whose greedy continuation repeats itself (" 1, 2, 1, 2, ...").
REPEATING = "1, 2, 1, 2, 1, 2,"


@pytest.fixture(scope="module")
def server(default_model):
    srv = start_server(default_model, 48, MAX_MODEL_LEN)
    yield srv
    srv.stop()


def chat(server, max_tokens=12, **fields) -> dict:
    body = {
        "model": server.model_name,
        "messages": [{"role": "user", "content": SHORT_ANSWER}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **fields,
    }
    status, answer = post(server.base_url, "/v1/chat/completions", body)
    assert status == 200, answer
    return answer


def complete(server, prompt=REPEATING, max_tokens=12, **fields) -> dict:
    body = {"model": server.model_name, "prompt": prompt, "max_tokens": max_tokens, **fields}
    body.setdefault("temperature", 0)
    status, answer = post(server.base_url, "/v1/completions", body)
    assert status == 200, answer
    return answer


def text(answer: dict) -> str:
    choice = answer["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def token_id(server, piece: str) -> int:
    status, body = post(server.base_url, "/tokenize", {"prompt": piece})
    assert status == 200 and body["count"] == 1, body
    return body["tokens"][0]


@pytest.fixture(scope="module")
def short(server):
    """The greedy answer that stops by itself well before max_tokens."""
    answer = chat(server)
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] < 8, answer  # else the prompt no longer fits
    return answer


def test_ignore_eos_runs_to_max_tokens(server, short):
    answer = chat(server, ignore_eos=True)
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 12
    assert text(answer).startswith(text(short))  # the same tokens up to where EOS came


def test_min_tokens_holds_eos_back(server, short):
    answer = chat(server, min_tokens=8)
    assert answer["usage"]["completion_tokens"] >= 8
    assert text(answer).startswith(text(short)) and len(text(answer)) > len(text(short))


def test_min_tokens_holds_stop_strings_back(server, short):
    """vLLM checks stop strings only past min_tokens: the stop the short answer ends with
    (its last character) cuts it early without min_tokens, not with it."""
    stop = text(short)[-1]
    assert text(chat(server, stop=[stop])) == text(short)[:-1]
    held = chat(server, stop=[stop], min_tokens=8)
    assert held["usage"]["completion_tokens"] >= 8 and text(held).startswith(text(short))


def test_top_k_1_and_min_p_1_sample_the_greedy_tokens(server):
    greedy = text(complete(server))
    for fields in ({"top_k": 1}, {"min_p": 1.0}):
        sampled = complete(server, temperature=1.0, seed=11, **fields)
        assert text(sampled) == greedy, fields
    # ... and without them, temperature 1 samples something else (the check can fail).
    free = [text(complete(server, temperature=1.0, seed=s, max_tokens=8)) for s in (1, 2, 3)]
    assert any(t != greedy for t in free)


@pytest.mark.parametrize(
    "penalty",
    [{"repetition_penalty": 1.5}, {"frequency_penalty": 1.5}, {"presence_penalty": 1.5}],
)
def test_penalties_break_a_greedy_repetition(server, penalty):
    # The bundled model is sure enough of " 1, 2, ..." that a presence penalty keeps it; this
    # prompt's greedy continuation repeats a phrase ("-in-the-wild-in-the-wild") it can leave.
    prompt = "the the the the"
    greedy = text(complete(server, prompt=prompt))
    assert greedy.count("in-the-wild") >= 2
    assert text(complete(server, prompt=prompt, **penalty)) != greedy


def test_stop_token_ids_stop_and_leave_the_token_out_unless_asked(server):
    greedy = complete(server)
    two = token_id(server, "2")
    cut = text(greedy).index("2")
    stopped = complete(server, stop_token_ids=[two])
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert text(stopped) == text(greedy)[:cut]  # vLLM leaves the stop token's text out
    kept = complete(server, stop_token_ids=[two], include_stop_str_in_output=True)
    assert text(kept) == text(greedy)[: cut + 1]
    assert kept["usage"]["completion_tokens"] == stopped["usage"]["completion_tokens"]


def test_include_stop_str_in_output_keeps_the_stop_string(server):
    greedy = text(complete(server))
    stop = ", 1"
    at = greedy.index(stop)
    assert text(complete(server, stop=[stop])) == greedy[:at]
    assert (
        text(complete(server, stop=[stop], include_stop_str_in_output=True))
        == greedy[: at + len(stop)]
    )


def test_skip_special_tokens_false_shows_them(server, short):
    tokenizer = server.driver.call(lambda e: e.tokenizer).result(60)
    shown = chat(server, ignore_eos=True, skip_special_tokens=False)
    hidden = chat(server, ignore_eos=True)
    # Past its EOS the model goes on into the template's next turn: special tokens galore.
    assert tokenizer.eos_token in text(shown) and tokenizer.eos_token not in text(hidden)
    visible = text(shown)
    for special in tokenizer.all_special_tokens:
        visible = visible.replace(special, "")
    assert visible == text(hidden)


def test_logit_bias_and_allowed_token_ids_steer_every_token(server):
    seven, eight = token_id(server, "7"), token_id(server, "8")
    biased = complete(server, max_tokens=4, logit_bias={str(seven): 100})
    assert text(biased) == "7777"
    allowed = complete(server, max_tokens=6, temperature=1.0, allowed_token_ids=[seven, eight])
    assert re.fullmatch("[78]{6}", text(allowed)), text(allowed)


def test_truncate_prompt_tokens_keeps_the_side_asked_for(server):
    prompt = "The quick brown fox jumps over the lazy dog. " * 3
    status, tokens = post(server.base_url, "/tokenize", {"prompt": prompt})
    ids = tokens["tokens"]
    # Unset, the end is kept: vLLM truncates generating models' prompts on the left
    # (vllm/tokenizers/registry.py), whatever side the tokenizer itself names.
    for side, kept in (("left", ids[-5:]), ("right", ids[:5]), (None, ids[-5:])):
        fields = {"truncate_prompt_tokens": 5}
        if side:
            fields["truncation_side"] = side
        cut = complete(server, prompt=prompt, max_tokens=4, **fields)
        assert cut["usage"]["prompt_tokens"] == 5
        # The same answer as for the kept ids themselves: those were the ones kept.
        assert text(cut) == text(complete(server, prompt=kept, max_tokens=4)), side
    whole = complete(server, prompt=prompt, max_tokens=1, truncate_prompt_tokens=-1)
    assert whole["usage"]["prompt_tokens"] == len(ids)  # -1: up to max_model_len - 1
    body = {"model": server.model_name, "prompt": prompt, "truncate_prompt_tokens": 999}
    status, answer = post(server.base_url, "/v1/completions", body)
    assert status == 400 and answer["error"]["param"] == "truncate_prompt_tokens"


def test_spaces_between_special_tokens_false_is_refused_only_where_it_matters(server):
    chat(server, spaces_between_special_tokens=False)  # special tokens skipped: no effect
    body = {
        "model": server.model_name,
        "prompt": "Hi",
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
    }
    status, answer = post(server.base_url, "/v1/completions", body)
    assert status == 400 and answer["error"]["param"] == "spaces_between_special_tokens"
