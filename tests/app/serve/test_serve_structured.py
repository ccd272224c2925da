"""Structured outputs through `kvscope serve`, asked for by the real `openai` client:
response_format (json_object, json_schema, the SDK's `parse` with pydantic models) and vLLM's
structured_outputs, on chat and completions. Every reply validates; every bad constraint is a
400 that names it, and costs other clients nothing."""

import json
import re
import threading
import time

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from served import start_server


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    population_millions: int = Field(ge=0, le=40)


class Trip(BaseModel):
    destination: City
    days: int = Field(ge=1, le=14)


@pytest.fixture(scope="module")
def server(default_model):
    srv = start_server(default_model, 256, 2048)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=120)


def _ask(text):
    return [{"role": "user", "content": text}]


def test_parse_with_pydantic_models(client, server):
    for seed in range(3):
        reply = client.chat.completions.parse(
            model=server.model_name,
            messages=_ask("Plan a trip."),
            response_format=Trip,
            max_tokens=300,
            temperature=0.8,
            seed=seed,
        )
        trip = reply.choices[0].message.parsed
        assert isinstance(trip, Trip) and isinstance(trip.destination, City)
        assert reply.choices[0].finish_reason == "stop"


def test_json_object_and_schema_replies_validate(client, server):
    reply = client.chat.completions.create(
        model=server.model_name,
        messages=_ask("Answer as JSON."),
        max_tokens=300,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "confidence": {"type": "number"}},
        "required": ["answer", "confidence"],
        "additionalProperties": False,
    }
    for strict in (True, False):
        reply = client.chat.completions.create(
            model=server.model_name,
            messages=_ask("Is the sky blue?"),
            max_tokens=100,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "verdict", "schema": schema, "strict": strict},
            },
        )
        jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


def test_streamed_structured_reply_is_the_whole_one(client, server):
    kwargs = dict(
        model=server.model_name,
        messages=_ask("A city, please."),
        max_tokens=200,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "city", "schema": City.model_json_schema()},
        },
    )
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(stream=True, **kwargs)
        if chunk.choices
    )
    assert streamed == whole
    City.model_validate_json(whole)


def test_vllm_structured_outputs_on_chat_and_completions(client, server):
    cases = [
        ({"regex": r"[0-9]{3}-[a-z]{3}"}, lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{3}", t)),
        ({"choice": ["alpha", "beta"]}, lambda t: t in ("alpha", "beta")),
        ({"grammar": 'start: "x" ("," "x"){0,4}'}, lambda t: re.fullmatch(r"x(,x){0,4}", t)),
        (
            {"json": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
            lambda t: isinstance(json.loads(t), list),
        ),
    ]
    for fields, check in cases:
        chat = client.chat.completions.create(
            model=server.model_name,
            messages=_ask("Go."),
            max_tokens=60,
            extra_body={"structured_outputs": fields},
        )
        assert check(chat.choices[0].message.content), (fields, chat.choices[0].message.content)
        done = client.completions.create(
            model=server.model_name,
            prompt="Answer:",
            max_tokens=60,
            extra_body={"structured_outputs": fields},
        )
        assert check(done.choices[0].text), (fields, done.choices[0].text)


def _bad(client, server, **kwargs):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=server.model_name, messages=_ask("x"), max_tokens=5, **kwargs
        )
    return e.value.body


@pytest.mark.parametrize(
    "kwargs,param,words",
    [
        ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
            "schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                }
            },
            "response_format",
            "nonsense",
        ),
        (
            {"extra_body": {"structured_outputs": {"regex": "a", "choice": ["b"]}}},
            "structured_outputs",
            "exactly one",
        ),
        ({"extra_body": {"structured_outputs": {"regex": "(open"}}}, "structured_outputs", "regex"),
        (
            {"extra_body": {"structured_outputs": {"structural_tag": "{}"}}},
            "structured_outputs",
            "structural_tag",
        ),
        ({"extra_body": {"structured_outputs": {"typo": 1}}}, "structured_outputs", "typo"),
    ],
)
def test_bad_constraints_get_a_400_naming_them(client, server, kwargs, param, words):
    body = _bad(client, server, **kwargs)
    assert body["param"] == param and words in body["message"], body


def test_deep_and_huge_schemas_are_refused_without_stalling_others(client, server):
    # Written out: json.dumps itself cannot nest 3,000 deep.
    deep = '{"type":"array","items":' * 3000 + '{"type":"string"}' + "}" * 3000
    huge = json.dumps({"enum": [f"value-{i}" for i in range(100_000)]})
    latencies = []

    def others():
        for _ in range(6):
            start = time.perf_counter()
            client.completions.create(model=server.model_name, prompt="Hi", max_tokens=1)
            latencies.append(time.perf_counter() - start)

    thread = threading.Thread(target=others)
    thread.start()
    for schema in (deep, huge):
        head = {"model": server.model_name, "messages": _ask("x"), "max_tokens": 5}
        body = json.dumps(head)[:-1] + (
            ', "response_format": {"type": "json_schema", "json_schema": {"name": "x", '
            f'"schema": {schema}}}}}}}'
        )
        response = httpx.post(
            f"{server.base_url}/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json"},
            timeout=60,
        )
        assert response.status_code == 400, response.text[:500]
        error = response.json()["error"]
        assert error["param"] == "response_format" or "nested too deeply" in error["message"]
    thread.join()
    assert max(latencies) < 10, latencies  # a generous bound: the point is no minute-long stall


def test_tools_and_a_response_format_together_are_refused(client, server):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = _bad(client, server, tools=[tool], response_format={"type": "json_object"})
    assert body["param"] == "response_format"
    # With tool_choice "none" the tools are off, so the format applies.
    reply = client.chat.completions.create(
        model=server.model_name,
        messages=_ask("JSON"),
        max_tokens=200,
        tools=[tool],
        tool_choice="none",
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
