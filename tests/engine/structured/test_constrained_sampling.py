"""Constrained decoding in the engine: every output follows its grammar, beside unconstrained
requests in the same steps, across n > 1, preemption and prefix-cache hits."""

import json

import jsonschema
import pytest

from kvscope.engine import LLM, SamplingParams, StructuredOutputsParams

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "Rome", "Oslo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm(default_model):
    return LLM(model=default_model, device="cpu", dtype="float32", num_kv_blocks=256)


def _chat(llm, text):
    return llm.engine.apply_chat_template([{"role": "user", "content": text}])


def _constrained(max_tokens=80, **kind):
    return SamplingParams(
        max_tokens=max_tokens, temperature=0.8, structured_outputs=StructuredOutputsParams(**kind)
    )


def _assert_clean(llm):
    llm.engine.allocator.check_invariants()
    assert llm.engine.allocator.num_used_blocks == 0


def test_json_schema_regex_and_choice_outputs_always_parse(llm):
    prompt = _chat(llm, "Tell me about someone you know.")
    outs = llm.generate(
        [prompt] * 3,
        [
            _constrained(json=PERSON),
            _constrained(regex=r"[A-Z][a-z]{2,8}-[0-9]{3}"),
            _constrained(choice=["red", "green", "blue"]),
        ],
    )
    person, code, colour = (o.outputs[0] for o in outs)
    assert person.finish_reason == "stop"
    jsonschema.validate(json.loads(person.text), PERSON)
    assert code.finish_reason == "stop"
    import re

    assert re.fullmatch(r"[A-Z][a-z]{2,8}-[0-9]{3}", code.text)
    assert colour.text in ("red", "green", "blue") and colour.finish_reason == "stop"
    _assert_clean(llm)


def test_json_object_is_any_object(llm):
    out = llm.generate([_chat(llm, "Answer in JSON.")], _constrained(200, json_object=True))[0]
    assert out.outputs[0].finish_reason == "stop"
    assert isinstance(json.loads(out.outputs[0].text), dict)


def test_constrained_and_free_requests_share_steps_and_free_ones_are_unchanged(llm):
    prompt = _chat(llm, "Name a colour.")
    greedy = SamplingParams(max_tokens=24, temperature=0)
    alone = llm.generate([prompt], greedy)[0].outputs[0].token_ids
    engine = llm.engine
    engine.add_request("free", prompt, greedy)
    engine.add_request("json", prompt, _constrained(json=PERSON))
    shared_steps = 0
    outputs = {}
    while engine.has_unfinished_requests():
        running = {s.request.request_id for s in engine.scheduler.running}
        shared_steps += running == {"free", "json"}
        for out in engine.step():
            outputs[out.request_id] = out
    assert shared_steps > 5  # they really ran side by side
    assert outputs["free"].outputs[0].token_ids == alone  # a neighbour's mask does not leak
    jsonschema.validate(json.loads(outputs["json"].outputs[0].text), PERSON)
    _assert_clean(llm)


def test_n_samples_each_follow_the_grammar(llm):
    params = SamplingParams(
        n=4,
        max_tokens=80,
        temperature=1.0,
        seed=3,
        structured_outputs=StructuredOutputsParams(json=PERSON),
    )
    out = llm.generate([_chat(llm, "Describe a person.")], params)[0]
    texts = [c.text for c in out.outputs]
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)
    assert len(set(texts)) > 1  # four samples, not one copied
    _assert_clean(llm)


def test_preempted_requests_resume_their_grammar(default_model):
    # A pool too small for all four: sequences are preempted and recomputed mid-object.
    small = LLM(model=default_model, device="cpu", dtype="float32", num_kv_blocks=14)
    prompt = small.engine.apply_chat_template([{"role": "user", "content": "Describe a person."}])
    params = [
        SamplingParams(
            max_tokens=60,
            temperature=0.9,
            seed=i,
            ignore_eos=True,
            structured_outputs=StructuredOutputsParams(json=PERSON),
        )
        for i in range(4)
    ]
    outs = small.generate([prompt] * 4, params)
    assert sum(o.outputs[0].num_preemptions for o in outs) > 0
    for o in outs:
        jsonschema.validate(json.loads(o.outputs[0].text), PERSON)
    _assert_clean(small)


def test_a_cached_prefix_changes_nothing_for_the_grammar(llm):
    prompt = _chat(llm, "Describe a person in a few words, as JSON, please. " * 4)
    params = SamplingParams(
        max_tokens=80, temperature=0, structured_outputs=StructuredOutputsParams(json=PERSON)
    )
    first = llm.generate([prompt], params)[0]
    second = llm.generate([prompt], params)[0]
    assert second.num_cached_tokens > 0
    assert second.outputs[0].text == first.outputs[0].text
    jsonschema.validate(json.loads(second.outputs[0].text), PERSON)


def test_the_trace_marks_constrained_requests(llm):
    engine = llm.engine
    engine.add_request("c1", _chat(llm, "x"), _constrained(choice=["a", "b"]))
    engine.add_request("f1", _chat(llm, "x"), SamplingParams(max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.trace.requests["c1"].constrained
    assert not engine.trace.requests["f1"].constrained


def test_a_bad_constraint_is_refused_and_the_engine_serves_on(llm):
    from kvscope.engine import GrammarError

    for kind in (
        {"json": {"type": "nonsense"}},
        {"regex": "(unclosed"},
        {"grammar": "start: undefined_rule"},
        {"json": {"enum": [f"value{i}" for i in range(100_000)]}},
    ):
        with pytest.raises(GrammarError) as e:
            llm.generate(["hi"], _constrained(**kind))
        assert e.value.param == "structured_outputs"
    assert llm.generate(["hi"], SamplingParams(max_tokens=2))[0].outputs[0].token_ids
    _assert_clean(llm)
