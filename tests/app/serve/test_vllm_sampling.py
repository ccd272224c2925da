"""`kvscope serve` against vLLM 0.33.0's own OpenAI request models and SamplingParams (imported
from its wheel by tests/vllm_code.py): every field vLLM's chat and completions requests take is
honoured, refused with a 400 naming it, or listed below as no sampling field with the reason; a
new field in vLLM fails test_every_vllm_field_is_classified instead of being dropped silently.
vLLM's own validation judges ours on boundary values. What the honoured fields do is checked in
tests/app/serve/test_vllm_sampling_behaviour.py."""

from __future__ import annotations

import openai
import pytest
import vllm_code
from served import start_server
from vllm_requests import PATHS, post, sampling_reads, verdict, vllm_fields

from kvscope.app.serve.protocol import (
    DROPPED_BY_VLLM,
    REFUSED_CHAT,
    REFUSED_COMPLETION,
    ChatCompletionRequest,
)
from kvscope.app.serve.protocol import CompletionRequest as OurCompletionRequest
from kvscope.engine.sampling_params import SamplingParams

MAX_MODEL_LEN = 128
REFUSED = {"chat": REFUSED_CHAT, "completion": REFUSED_COMPLETION}
OUR_MODELS = {"chat": ChatCompletionRequest, "completion": OurCompletionRequest}

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

# Honoured fields, each with a non-default value vLLM takes (and what else the body needs).
HONOURED: dict[str, dict] = {
    "model": {},
    "max_tokens": {"max_tokens": 3},
    "temperature": {"temperature": 0.5},
    "top_p": {"top_p": 0.9},
    "top_k": {"top_k": 5},
    "min_p": {"min_p": 0.1},
    "n": {"n": 2},
    "seed": {"seed": 3},
    "stop": {"stop": ["x"]},
    "stop_token_ids": {"stop_token_ids": [5]},
    "presence_penalty": {"presence_penalty": 0.5},
    "frequency_penalty": {"frequency_penalty": 0.5},
    "repetition_penalty": {"repetition_penalty": 1.2},
    "logit_bias": {"logit_bias": {"5": 1.5}},
    "allowed_token_ids": {"allowed_token_ids": [5, 6]},
    "ignore_eos": {"ignore_eos": True},
    "min_tokens": {"min_tokens": 1},
    "include_stop_str_in_output": {"include_stop_str_in_output": True},
    "skip_special_tokens": {"skip_special_tokens": False},
    "spaces_between_special_tokens": {"spaces_between_special_tokens": False},
    "truncate_prompt_tokens": {"truncate_prompt_tokens": 2},
    "truncation_side": {"truncation_side": "left"},
    "stream": {"stream": True},
    "stream_options": {"stream": True, "stream_options": {"include_usage": True}},
    "response_format": {"response_format": {"type": "json_object"}},
    "structured_outputs": {"structured_outputs": {"regex": "[ab]+"}},
}
HONOURED_CHAT = {
    **HONOURED,
    "tools": {"tools": [TOOL]},
    "tool_choice": {"tools": [TOOL], "tool_choice": "required"},
    "parallel_tool_calls": {"tools": [TOOL], "parallel_tool_calls": False},
    "chat_template_kwargs": {"chat_template_kwargs": {"enable_thinking": False}},
    "messages": {},
    "max_completion_tokens": {"max_completion_tokens": 3},
    "logprobs": {"logprobs": True},
    "top_logprobs": {"logprobs": True, "top_logprobs": 2},
}
HONOURED_COMPLETION = {**HONOURED, "prompt": {}, "logprobs": {"logprobs": 2}}
HONOURED_BY_KIND = {"chat": HONOURED_CHAT, "completion": HONOURED_COMPLETION}

REFUSED_EXAMPLES: dict[str, dict] = {
    "use_beam_search": {"use_beam_search": True},
    "length_penalty": {"length_penalty": 0.5},
    "watermarking": {"watermarking": True},
    "prompt_logprobs": {"prompt_logprobs": 1},
    "logprob_token_ids": {"logprob_token_ids": [5]},  # with logprobs: see _refused_example
    "bad_words": {"bad_words": ["blue"]},
    "repetition_detection": {"repetition_detection": {"max_pattern_size": 4, "min_count": 3}},
    "thinking_token_budget": {"thinking_token_budget": 10},
    "priority": {"priority": 1},
    "cache_salt": {"cache_salt": "a-salt-of-some-length"},
    "kv_transfer_params": {"kv_transfer_params": {"do_remote_prefill": True}},
    "ec_transfer_params": {"ec_transfer_params": {"x": 1}},
    "vllm_xargs": {"vllm_xargs": {"a": 1}},
    "routed_experts_prompt_start": {"routed_experts_prompt_start": 2},
    "stream_interval": {"stream_interval": 4},
    "echo": {"echo": True},
    "documents": {"documents": [{"title": "a", "text": "b"}]},
    "chat_template": {"chat_template": "{{ messages[0]['content'] }}"},
    "reasoning_effort": {"reasoning_effort": "low"},
    "continue_final_message": {"continue_final_message": True, "add_generation_prompt": False},
    "add_generation_prompt": {"add_generation_prompt": False},
    "add_special_tokens": {"add_special_tokens": True},
    "suffix": {"suffix": "!"},
    "prompt_embeds": {"prompt_embeds": "AAAA"},
}

# Fields of vLLM's requests that ask nothing of sampling, accepted and left as they are.
NOT_SAMPLING: dict[str, str] = {
    "user": "a caller's label: vLLM ignores it (KVScope colours the block map by it)",
    "include_reasoning": "no reasoning parser: reasoning stays in the content, as vLLM's without",
    "media_io_kwargs": "multimodal inputs: the served models read text only",
    "mm_processor_kwargs": "multimodal inputs: the served models read text only",
    "mm_payload": "render endpoints only; vLLM ignores it on generation",
    "return_mm_kwargs": "deprecated alias of mm_payload",
    "return_token_offsets": "render endpoints only; vLLM ignores it on generation",
    "request_id": "names the response in vLLM; KVScope names requests by client and number",
    "session_id": "a router's session identity: no effect inside one server",
    "return_tokens_as_token_ids": "response extra not produced: logprob tokens stay text",
    "return_token_ids": "response extra not produced: choices carry no token_ids",
    "return_weight_versions": "response extra not produced: one weight version",
    "return_prompt_text": "response extra not produced: no prompt_text",
    "add_special_tokens": "completions: KVScope encodes a prompt without adding special tokens; "
    "vLLM's default adds them where the tokenizer has any (a BOS), which ours does not",
}
# SamplingParams fields that are no request field: why none is needed.
SAMPLING_PARAMS_ONLY = {
    "prompt_logprob_token_ids": "offline scoring API; vLLM's server does not take it",
    "prompt_logprob_start": "offline scoring API; vLLM's server does not take it",
    "flat_logprobs": "how vLLM stores logprobs internally",
    "detokenize": "engine level; vLLM's server always detokenizes (so does KVScope)",
    "output_kind": "follows `stream` in vLLM's server",
    "skip_clone": "internal to vLLM",
    "output_text_buffer_length": "derived from stop (KVScope's StopChecker holds the same back)",
    "extra_args": "built from vllm_xargs and the transfer params, which are refused",
    "skip_reading_prefix_cache": "derived from prompt_logprobs, which is refused",
    "trace_decode_token_ids": "a debugging / RL knob vLLM's server does not take",
}


CHAT_ONLY = {
    "include_reasoning",
    "media_io_kwargs",
    "mm_processor_kwargs",
    "return_prompt_text",
}


def _not_sampling(kind: str) -> dict[str, str]:
    # add_special_tokens is refused on chat (the template adds them) but not on completions.
    drop = {"add_special_tokens"} if kind == "chat" else CHAT_ONLY
    return {k: v for k, v in NOT_SAMPLING.items() if k not in drop}


@pytest.fixture(scope="module")
def server(default_model):
    srv = start_server(default_model, 48, MAX_MODEL_LEN)
    srv.vocab_size = srv.driver.call(lambda e: e.model_config.vocab_size).result(60)
    yield srv
    srv.stop()


def _body(server, kind: str, extra: dict) -> dict:
    base = {"model": server.model_name, "max_tokens": 2}
    if kind == "chat":
        base["messages"] = [{"role": "user", "content": "Count: 1, 2,"}]
    else:
        base["prompt"] = "1, 2, 1, 2,"
    return {**base, **extra}


def _vllm_takes(server, kind: str, body: dict) -> None:
    error = verdict(kind, body, server.vocab_size, MAX_MODEL_LEN)
    assert error is None, f"vLLM 0.33 refuses {body}: {error}"


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_every_vllm_field_is_classified(kind):
    fields = set(vllm_fields(kind))
    honoured, refused = set(HONOURED_BY_KIND[kind]), set(REFUSED[kind])
    other = set(_not_sampling(kind))
    assert not (honoured & refused) and not (honoured & other) and not (refused & other)
    assert honoured | refused | other == fields, (
        f"vLLM fields not classified: {sorted(fields - honoured - refused - other)}; "
        f"classified but not vLLM's: {sorted((honoured | refused | other) - fields)}"
    )
    # What vLLM's own to_sampling_params reads is a sampling field, never "not sampling".
    assert sampling_reads(kind) <= honoured | refused, sorted(sampling_reads(kind) & other)
    # An honoured field is declared (typed) in our model, not just kept as an unknown extra.
    assert honoured <= set(OUR_MODELS[kind].model_fields)


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_refused_fields_count_vllms_default_as_unused(kind):
    defaults = vllm_fields(kind)
    for name, unused in REFUSED[kind].items():
        assert defaults[name] in unused, (name, defaults[name], unused)


def test_sampling_params_fields_are_vllms_or_explained():
    sp = vllm_code.module("vllm.sampling_params").SamplingParams
    theirs = {f for f in sp.__struct_fields__ if not f.startswith("_")}
    requests = set(vllm_fields("chat")) | set(vllm_fields("completion"))
    assert theirs - requests == set(SAMPLING_PARAMS_ONLY)
    # The engine's SamplingParams uses vLLM's names for what it shares.
    assert set(SamplingParams.__dataclass_fields__) <= theirs


def _refused_example(kind: str, name: str) -> dict:
    extra = dict(REFUSED_EXAMPLES[name])
    if name == "logprob_token_ids":  # vLLM wants logprobs with it
        extra["logprobs"] = True if kind == "chat" else 1
    return extra


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_refused_fields_get_a_400_naming_them(server, kind):
    for name in REFUSED[kind]:
        body = _body(server, kind, _refused_example(kind, name))
        _vllm_takes(server, kind, body)  # a request vLLM serves: refusing it is our choice
        status, answer = post(server.base_url, PATHS[kind], body)
        assert status == 400, (name, answer)
        assert answer["error"]["param"] == name and name in answer["error"]["message"]
        # Its unused value passes.
        default = REFUSED[kind][name][0]
        status, answer = post(server.base_url, PATHS[kind], _body(server, kind, {name: default}))
        assert status == 200, (name, answer)


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_honoured_fields_are_served(server, kind):
    for name, extra in HONOURED_BY_KIND[kind].items():
        body = _body(server, kind, extra)
        _vllm_takes(server, kind, body)
        status, answer = post(server.base_url, PATHS[kind], body)
        assert status == 200, (name, answer)


# (field, value, other fields): boundary values; vLLM's code decides which are refused.
PROBES = [
    ("temperature", 2.0, {}),
    ("temperature", 2.5, {}),
    ("temperature", -0.5, {}),
    ("top_p", 0.0, {}),
    ("top_p", 1.0, {}),
    ("top_p", 1.5, {}),
    ("top_k", -1, {}),
    ("top_k", 0, {}),
    ("top_k", -2, {}),
    ("min_p", 1.0, {}),
    ("min_p", 1.5, {}),
    ("min_p", -0.1, {}),
    ("repetition_penalty", 0.0, {}),
    ("repetition_penalty", -1.0, {}),
    ("presence_penalty", 2.0, {}),
    ("presence_penalty", 2.5, {}),
    ("frequency_penalty", -2.0, {}),
    ("frequency_penalty", -2.01, {}),
    ("min_tokens", -1, {}),
    ("min_tokens", 2, {}),
    ("min_tokens", 3, {}),  # above max_tokens (2)
    ("n", 0, {}),
    ("n", 2, {"temperature": 0.0}),  # vLLM: greedy sampling takes n == 1 only
    ("n", 2, {"temperature": 1e-6}),  # ... but vLLM raises this temperature to 0.01
    ("seed", 2**63, {}),
    ("seed", -(2**63), {}),
    ("seed", -1, {}),
    ("stop_token_ids", [-1], {}),
    ("stop_token_ids", "VOCAB", {}),
    ("logit_bias", {"x": 1.0}, {}),
    ("logit_bias", {"-1": 1.0}, {}),
    ("logit_bias", "VOCAB", {}),
    ("logit_bias", {"5": 500.0}, {}),  # clamped to 100
    ("allowed_token_ids", [], {}),
    ("allowed_token_ids", "VOCAB", {}),
    ("max_tokens", 0, {}),
    ("truncate_prompt_tokens", -2, {}),
    ("truncation_side", "middle", {}),
    ("logprobs", 20, {}),
    ("logprobs", 21, {}),
    ("logprobs", -1, {}),
]
CHAT_PROBES = [
    ("top_logprobs", 2, {}),  # without logprobs
    ("top_logprobs", 21, {"logprobs": True}),
    ("top_logprobs", -1, {"logprobs": True}),
    ("top_logprobs", 20, {"logprobs": True}),
]


@pytest.mark.parametrize(
    ("kind", "field", "value", "extra"),
    [("completion", *p) for p in PROBES] + [("chat", *p) for p in CHAT_PROBES],
)
def test_bounds_are_vllms(server, kind, field, value, extra):
    if value == "VOCAB":  # the first id past the vocabulary
        vocab = server.vocab_size
        value = {str(vocab): 1.0} if field == "logit_bias" else [vocab]
    body = _body(server, kind, {field: value, **extra})
    refused_by_vllm = verdict(kind, body, server.vocab_size, MAX_MODEL_LEN)
    status, answer = post(server.base_url, PATHS[kind], body)
    assert status == (200 if refused_by_vllm is None else 400), (refused_by_vllm, answer)
    if status == 400:
        assert answer["error"]["param"].split(".")[0] == field, answer


def test_tokenize_returns_token_strs_as_vllm(server):
    tokenize = vllm_code.module("vllm.entrypoints.serve.tokenize.protocol")
    request = {"prompt": "Hello world, 1 2 3", "return_token_strs": True}
    assert tokenize.TokenizeCompletionRequest.model_validate(request).return_token_strs
    status, body = post(server.base_url, "/tokenize", request)
    assert status == 200, body
    # vLLM's response model reads it back unchanged: same keys, same types.
    assert tokenize.TokenizeResponse.model_validate(body).model_dump() == body
    tokenizer = server.driver.call(lambda e: e.tokenizer).result(60)
    # vLLM's pieces are the tokenizer's tokens (convert_ids_to_tokens), not decoded text.
    assert body["token_strs"] == tokenizer.convert_ids_to_tokens(body["tokens"])
    assert tokenizer.convert_tokens_to_string(body["token_strs"]) == request["prompt"]
    status, plain = post(server.base_url, "/tokenize", {"prompt": request["prompt"]})
    assert plain["token_strs"] is None and plain["tokens"] == body["tokens"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/detokenize", {"tokens": [1, True]}, "tokens"),
        ("/v1/completions", {"prompt": [1, True]}, "prompt"),
        ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs"),
        ("/v1/completions", {"prompt": "x", "stop_token_ids": [True]}, "stop_token_ids"),
        ("/v1/completions", {"prompt": "x", "allowed_token_ids": [False]}, "allowed_token_ids"),
        ("/v1/completions", {"prompt": "x", "min_tokens": True}, "min_tokens"),
        ("/v1/completions", {"prompt": "x", "top_k": True}, "top_k"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": True}, "top_logprobs"),
    ],
)
def test_booleans_are_not_ints(server, path, body, param):
    """True is not token 1 nor a count of 1 (vLLM's lax pydantic would take it as 1)."""
    full = {"model": server.model_name, "max_tokens": 1, **body}
    if path.endswith("chat/completions"):
        full["messages"] = [{"role": "user", "content": "Hi"}]
    status, answer = post(server.base_url, path, full)
    assert status == 400, answer
    assert answer["error"]["param"].split(".")[0] == param, answer


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_best_of_is_refused_not_dropped(server, kind):
    """vLLM 0.33 no longer declares best_of and drops it as an unknown extra: the client gets n
    answers, not the best n of best_of, and is not told. Here it is a 400 naming it."""
    for name in DROPPED_BY_VLLM:
        assert name not in vllm_fields(kind)
    body = _body(server, kind, {"best_of": 3})
    _vllm_takes(server, kind, body)
    status, answer = post(server.base_url, PATHS[kind], body)
    assert status == 400, answer
    assert answer["error"]["param"] == "best_of" and "got 3, n=1" in answer["error"]["message"]
    for same in ({"best_of": None}, {"best_of": 1}, {"best_of": 2, "n": 2, "temperature": 1}):
        status, answer = post(server.base_url, PATHS[kind], _body(server, kind, same))
        assert status == 200, (same, answer)  # best_of == n keeps every candidate: no change
    status, answer = post(server.base_url, PATHS[kind], _body(server, kind, {"best_of": True}))
    assert status == 400 and answer["error"]["param"] == "best_of"


def test_best_of_through_openais_client(server):
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
    asked = {"model": server.model_name, "prompt": "1, 2,", "max_tokens": 2}
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(**asked, best_of=4)
    assert refused.value.body["param"] == "best_of"
    answer = client.completions.create(**asked, best_of=1)
    assert len(answer.choices) == 1
