"""Each tool-call format's grammar against its own reader: what the bundled model writes under
the grammar reads back as calls whose arguments validate against the tool's parameters, whole
and streamed a token at a time."""

import json

import jsonschema
import pytest

from kvscope.app.serve.tools.formats import (
    GenericFormat,
    HermesFormat,
    Llama3JsonFormat,
    pick_format,
)
from kvscope.app.serve.tools.replies import ToolCallDeltas, message
from kvscope.app.serve.tools.spec import ToolChoice, read_tools
from kvscope.engine import LLM, SamplingParams, StructuredOutputsParams

TOOLS = read_tools(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "maxLength": 20},
                        "unit": {"enum": ["c", "f"]},
                    },
                    "required": ["city", "unit"],
                },
            },
        },
        {
            "type": "function",
            "function": {
                "name": "add",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "a": {"type": "integer"},
                        "b": {"$ref": "#/$defs/small"},
                    },
                    "required": ["a", "b"],
                    "$defs": {"small": {"type": "integer", "minimum": 0, "maximum": 9}},
                },
            },
        },
    ]
)
PARAMETERS = {t.name: t.parameters for t in TOOLS}
FORMATS = [GenericFormat(), HermesFormat(), Llama3JsonFormat()]
CHOICES = [
    ToolChoice("required"),
    ToolChoice("required", parallel=False),
    ToolChoice("named", "add", parallel=False),
    ToolChoice("auto"),
]


@pytest.fixture(scope="module")
def llm(default_model):
    return LLM(model=default_model, device="cpu", dtype="float32", num_kv_blocks=256)


def _generate(llm, fmt, choice, seed):
    prompt = llm.engine.apply_chat_template(
        [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]
    )
    params = SamplingParams(
        max_tokens=400,
        temperature=0.9,
        seed=seed,
        structured_outputs=StructuredOutputsParams(grammar=fmt.grammar(TOOLS, choice)),
    )
    return llm.generate([prompt], params)[0].outputs[0]


def _streamed(fmt, text, tokens, tokenizer):
    """Replay the reply a token at a time through the streaming reader."""
    deltas = ToolCallDeltas(fmt)
    content, calls = "", {}
    for n in range(1, len(tokens) + 1):
        delta = deltas.step(tokenizer.decode(tokens[:n]))
        content += delta.get("content", "")
        for piece in delta.get("tool_calls", []):
            call = calls.setdefault(piece["index"], {"name": None, "arguments": ""})
            if "id" in piece:
                assert call["name"] is None  # the id and name come once, first
                call["name"] = piece["function"]["name"]
            call["arguments"] += piece["function"]["arguments"]
    return content, [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("choice", CHOICES, ids=lambda c: f"{c.mode}-{c.parallel}")
def test_replies_under_the_grammar_read_back_as_valid_calls(llm, fmt, choice):
    tokenizer = llm.engine.tokenizer
    for seed in range(1):
        out = _generate(llm, fmt, choice, seed)
        assert out.finish_reason == "stop", out.text
        reply, called = message(fmt, out.text)
        if not called:
            assert choice.mode == "auto" and reply["content"] is not None
            continue
        calls = reply["tool_calls"]
        if not choice.parallel:
            assert len(calls) == 1
        for call in calls:
            name = call["function"]["name"]
            assert choice.mode != "named" or name == choice.name
            jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMETERS[name])
        content, streamed = _streamed(fmt, out.text, out.token_ids, tokenizer)
        assert [(c["name"], c["arguments"]) for c in streamed] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in calls
        ]
        assert content == (reply["content"] or "")


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_a_text_answer_streams_as_content(fmt, default_model_lazy):
    tokenizer = default_model_lazy.tokenizer
    answer = 'It is "sunny" in Paris.\nNo tool needed.'
    text = json.dumps({"response": answer}) if fmt.name == "generic" else answer
    tokens = tokenizer.encode(text, add_special_tokens=False)
    content, calls = _streamed(fmt, text, tokens, tokenizer)
    assert (content, calls) == (answer, [])
    assert message(fmt, text) == ({"role": "assistant", "content": answer}, False)


@pytest.mark.parametrize(
    "template,expected",
    [
        ("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}", "generic"),
        (
            '{% if tools %}{{ tools | tojson }}<tool_call>{"name": n, "arguments": a}{% endif %}',
            "hermes",
        ),
        # <tool_call> around XML-like parameters (Qwen 3.5, GLM 4.5): not hermes' JSON.
        ("{% if tools %}<tool_call>\n<function=f>\n<parameter=x>{% endif %}", "generic"),
        ('{% if tools %}{"name": x, "parameters": y}<|eot_id|>{% endif %}', "llama3_json"),
        (None, "generic"),
    ],
)
def test_the_format_is_read_from_the_template(template, expected):
    assert pick_format(template).name == expected
