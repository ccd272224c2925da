"""vLLM 0.33's OpenAI request models, from its wheel (tests/vllm_code.py), as the sampling
conformance tests use them: their fields and defaults, which fields vLLM's own conversion to
SamplingParams reads, and vLLM's verdict on a request body; plus a plain HTTP post."""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
import types
import urllib.error
import urllib.request

import pydantic
import vllm_code

MODULES = {
    "chat": ("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionRequest"),
    "completion": ("vllm.entrypoints.openai.completion.protocol", "CompletionRequest"),
}
PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
# vLLM's default --max-logprobs (its ModelConfig.max_logprobs), which SamplingParams.verify reads.
VLLM_MAX_LOGPROBS = 20


def request_class(kind: str) -> type[pydantic.BaseModel]:
    module, name = MODULES[kind]
    return getattr(vllm_code.module(module), name)


def vllm_fields(kind: str) -> dict[str, object]:
    """Every field of vLLM's request model -> its default (the factory's value where it has one)."""
    out = {}
    for name, field in request_class(kind).model_fields.items():
        factory = field.default_factory
        out[name] = factory() if factory is not None else field.default
    return out


def sampling_reads(kind: str) -> set[str]:
    """The request fields vLLM's to_sampling_params and to_beam_search_params read, following
    the methods they call on the request (extract_structured_outputs): read from vLLM's source."""
    cls = request_class(kind)
    fields = set(cls.model_fields)
    seen: set[str] = set()
    pending = ["to_sampling_params", "to_beam_search_params"]
    reads: set[str] = set()
    while pending:
        method = pending.pop()
        if method in seen:
            continue
        seen.add(method)
        tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(cls, method))))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "self":
                if node.attr in fields:
                    reads.add(node.attr)
                elif callable(getattr(cls, node.attr, None)):
                    pending.append(node.attr)
    # `getattr(self, name)` over _DEFAULT_SAMPLING_PARAMS: the penalties, temperature, top-*.
    defaults = cls.__private_attributes__["_DEFAULT_SAMPLING_PARAMS"].default
    return reads | set(defaults)


def verdict(kind: str, body: dict, vocab_size: int, max_model_len: int) -> str | None:
    """None when vLLM 0.33 takes this body (its pydantic model, to_sampling_params and
    SamplingParams.verify, with vLLM's default max_logprobs); else vLLM's error message."""
    exceptions = vllm_code.module("vllm.exceptions")
    model_config = types.SimpleNamespace(
        max_logprobs=VLLM_MAX_LOGPROBS,
        get_vocab_size=lambda: vocab_size,
        max_model_len=max_model_len,
        is_diffusion=False,
    )
    try:
        request = request_class(kind).model_validate(body)
        # As vLLM's serving layer passes it (get_max_tokens): what was asked for, capped by
        # the room the prompt leaves (here a short prompt).
        asked = body.get("max_tokens")
        if kind == "chat" and body.get("max_completion_tokens") is not None:
            asked = body["max_completion_tokens"]
        room = max_model_len // 2
        params = request.to_sampling_params(room if asked is None else min(asked, room), {})
        params.verify(model_config, None, None, None)
    except (pydantic.ValidationError, exceptions.VLLMError, ValueError) as e:
        return str(e)
    return None


def post(base_url: str, path: str, body: dict) -> tuple[int, dict | str]:
    """(status, JSON body) of a POST; a stream's raw text when the answer is not JSON."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(
        base_url + path, data, {"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            status, raw = response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read().decode()
    try:
        return status, json.loads(raw)
    except json.JSONDecodeError:
        return status, raw
