"""Hypothesis over random JSON Schemas: whatever the schema, the bundled 135M model's
constrained output parses and validates (the point of constraining a small model)."""

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvscope.engine import LLM, SamplingParams, StructuredOutputsParams

_NAMES = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)

# Bounded leaves, so that every valid output fits max_tokens.
_LEAVES = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(
        lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
        st.integers(-1000, 1000),
        st.integers(0, 1000),
    ),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 12)),
    st.builds(
        lambda values: {"enum": values},
        st.lists(
            st.one_of(_NAMES, st.integers(-5, 5), st.booleans()),
            min_size=1,
            max_size=5,
            unique=True,
        ),
    ),
    st.builds(
        lambda p: {"type": "string", "pattern": p},
        st.sampled_from(["^[a-z]{1,5}$", "^[0-9]{2}-[A-Z]$"]),
    ),
)


def _object(props: dict, required: list) -> dict:
    return {
        "type": "object",
        "properties": props,
        "required": [k for k in props if k in required],
        "additionalProperties": False,
    }


_SCHEMAS = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.builds(
            lambda items, n: {"type": "array", "items": items, "maxItems": n},
            inner,
            st.integers(0, 3),
        ),
        st.builds(
            _object,
            st.dictionaries(_NAMES, inner, min_size=1, max_size=3),
            st.lists(_NAMES, max_size=3),
        ),
        st.builds(lambda a, b: {"anyOf": [a, b]}, inner, inner),
    ),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def llm(default_model):
    return LLM(model=default_model, device="cpu", dtype="float32", num_kv_blocks=256)


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schema=_SCHEMAS, seed=st.integers(0, 2**16))
def test_random_schemas_always_give_valid_json(llm, schema, seed):
    prompt = llm.engine.apply_chat_template([{"role": "user", "content": "Some JSON, please."}])
    params = SamplingParams(
        max_tokens=300,
        temperature=1.0,
        seed=seed,
        structured_outputs=StructuredOutputsParams(json=schema),
    )
    out = llm.generate([prompt], params)[0].outputs[0]
    assert out.finish_reason == "stop", (schema, out.text)
    jsonschema.validate(json.loads(out.text), schema)
    llm.engine.allocator.check_invariants()
