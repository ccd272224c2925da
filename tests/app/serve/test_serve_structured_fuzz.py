"""Hypothesis against the server's structured-output and tool fields: random schemas, random
junk where a schema or a tool belongs. Never a 5xx; a reply that finished validates."""

import json

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from served import start_server

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_KEYWORDS = st.sampled_from(
    [
        "type",
        "properties",
        "items",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "required",
        "minItems",
        "maxItems",
        "maxLength",
        "pattern",
        "format",
        "additionalProperties",
        "not",
    ]
)
_TYPES = st.sampled_from(["object", "array", "string", "integer", "number", "boolean", "null"])
# Schema-shaped dicts: real keywords with values that may or may not make sense.
_SCHEMAISH = st.recursive(
    st.fixed_dictionaries({"type": _TYPES}),
    lambda inner: st.dictionaries(_KEYWORDS, inner | _JSON | _TYPES, min_size=1, max_size=4),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def server(default_model):
    srv = start_server(default_model, 128, 1024)
    yield srv
    srv.stop()


def _post(server, body):
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    schema=_SCHEMAISH | _JSON,
    where=st.sampled_from(["response_format", "structured_outputs", "tool"]),
    choice=st.sampled_from([None, "auto", "required", "none"]) | _JSON,
)
def test_random_constraints_never_get_a_5xx(server, schema, where, choice):
    body = {
        "model": server.model_name,
        "messages": [{"role": "user", "content": "Go."}],
        "max_tokens": 40,
    }
    if where == "response_format":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": schema},
        }
    elif where == "structured_outputs":
        body["structured_outputs"] = {"json": schema}
    else:
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
        if choice is not None:
            body["tool_choice"] = choice
    response = _post(server, body)
    assert response.status_code in (200, 400), response.text[:500]
    if response.status_code == 400:
        assert response.json()["error"]["message"]
        return
    choice_out = response.json()["choices"][0]
    if where == "tool" or choice_out["finish_reason"] != "stop" or not isinstance(schema, dict):
        return
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError:
        return  # not a schema jsonschema can judge the reply by
    jsonschema.validate(json.loads(choice_out["message"]["content"]), schema)
