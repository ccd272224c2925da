"""Function calling through `kvscope serve` with the real `openai` client: tool_choice none,
auto, required and named, streamed and whole, parallel or not, and a tool result sent back.
Every call names a tool that was offered and its arguments validate against that tool's
parameters, on the bundled 135M model (the grammar makes that so)."""

import copy
import dataclasses
import json

import jsonschema
import openai
import pytest
from served import start_server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
TOOLS = [WEATHER, ADD]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]

# A Hermes-style template (as Qwen 2.5's renders tools and calls), for the native path.
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call these tools:\n<tools>\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\nCall one as <tool_call>\n"
    '{"name": <name>, "arguments": <args>}\n</tool_call><|im_end|>\n{% endif %}'
    "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}"
    "<|im_start|>assistant\n{% for c in m.tool_calls %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n'
    "</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def server(default_model):
    srv = start_server(default_model, 256, 2048)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=120)


def _valid_calls(calls, allowed=None):
    assert calls
    for call in calls:
        name = call.function.name
        assert name in (allowed or PARAMETERS)
        assert call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[name])


def _create(client, server, **kwargs):
    base = dict(model=server.model_name, messages=QUESTION, tools=TOOLS, max_tokens=300)
    return client.chat.completions.create(**{**base, **kwargs})


def _streamed(client, server, **kwargs):
    """(content, calls as (id, name, arguments), finish_reason) reassembled from a stream."""
    content, calls, reason = "", {}, None
    for chunk in _create(client, server, stream=True, **kwargs):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for piece in choice.delta.tool_calls or []:
            call = calls.setdefault(piece.index, {"id": None, "name": None, "arguments": ""})
            if piece.id:
                assert call["id"] is None and piece.function.name  # id and name come first
                call["id"], call["name"] = piece.id, piece.function.name
            call["arguments"] += piece.function.arguments or ""
        reason = choice.finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


def test_required_calls_validate_whole_and_streamed(client, server):
    for parallel in (True, False):
        reply = _create(client, server, tool_choice="required", parallel_tool_calls=parallel)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        _valid_calls(choice.message.tool_calls)
        if not parallel:
            assert len(choice.message.tool_calls) == 1
    greedy = dict(tool_choice="required", temperature=0)
    whole = _create(client, server, **greedy).choices[0].message.tool_calls
    content, streamed, reason = _streamed(client, server, **greedy)
    assert reason == "tool_calls" and content == ""
    assert [(c["name"], c["arguments"]) for c in streamed] == [
        (c.function.name, c.function.arguments) for c in whole
    ]


def test_a_named_tool_is_the_one_called(client, server):
    choice = {"type": "function", "function": {"name": "add"}}
    reply = _create(client, server, tool_choice=choice)
    calls = reply.choices[0].message.tool_calls
    assert len(calls) == 1
    _valid_calls(calls, allowed={"add"})


def test_auto_answers_or_calls_and_none_answers(client, server):
    for seed in range(3):
        message = _create(client, server, tool_choice="auto", seed=seed).choices[0].message
        if message.tool_calls:
            _valid_calls(message.tool_calls)
        else:
            assert isinstance(message.content, str) and message.content
    reply = _create(client, server, tool_choice="none", max_tokens=20)
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_a_tool_result_round_trip(client, server):
    first = _create(client, server, tool_choice="required", parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    history = [
        *QUESTION,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"result": "21 C, sunny"})},
    ]
    reply = client.chat.completions.create(
        model=server.model_name, messages=history, tools=TOOLS, max_tokens=200
    )
    message = reply.choices[0].message
    assert message.content or message.tool_calls
    if message.tool_calls:
        _valid_calls(message.tool_calls)


@pytest.mark.parametrize(
    "kwargs,param",
    [
        (
            {"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
            "tools[0].function.name",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f" * 65}}]},
            "tools[0].function.name",
        ),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        (
            {
                "tools": [
                    {**ADD, "function": {**ADD["function"], "name": f"t{i}"}} for i in range(5000)
                ]
            },
            "tools",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "nonsense"}},
                    }
                ]
            },
            "tools",
        ),
    ],
)
def test_bad_tools_get_a_400_naming_them(client, server, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=server.model_name, messages=QUESTION, max_tokens=5, **kwargs
        )
    assert e.value.body["param"] == param, e.value.body


@pytest.fixture(scope="module")
def hermes_server(default_model):
    tokenizer = copy.deepcopy(default_model.tokenizer)  # the session's model keeps its own
    tokenizer.chat_template = HERMES_TEMPLATE
    srv = start_server(dataclasses.replace(default_model, tokenizer=tokenizer), 256, 2048)
    yield srv
    srv.stop()


def test_a_template_that_renders_tools_gets_them_and_its_own_format(hermes_server):
    client = openai.OpenAI(
        base_url=f"{hermes_server.base_url}/v1", api_key="x", max_retries=0, timeout=120
    )
    prompt = hermes_server.driver.call(lambda e: e.apply_chat_template(QUESTION, [WEATHER])).result(
        60
    )
    assert '"name": "get_weather"' in prompt and "<tool_call>" in prompt
    reply = _create(client, hermes_server, tool_choice="required", parallel_tool_calls=False)
    calls = reply.choices[0].message.tool_calls
    _valid_calls(calls)
    history = [
        *QUESTION,
        reply.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny"},
    ]
    # The past call reaches the template as an object (transformers' convention), so the
    # template writes it as JSON once, not as a quoted string.
    rendered = hermes_server.driver.call(
        lambda e: e.apply_chat_template(
            [
                *QUESTION,
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "add", "arguments": {"a": 1, "b": 2}},
                        }
                    ],
                },
            ],
            [ADD],
        )
    ).result(60)
    assert '"arguments": {"a": 1, "b": 2}' in rendered
    follow = client.chat.completions.create(
        model=hermes_server.model_name, messages=history, tools=TOOLS, max_tokens=200
    )
    message = follow.choices[0].message
    assert message.content or message.tool_calls
