"""A chat's structured output: a JSON Schema that every reply must follow, as LM Studio offers.

The setting is kept with the chat's sampling settings (the store's `sampling` JSON), under
"structured_output": whether it is on and the schema as typed, kept even while it does not
parse, so that a half-typed schema survives switching chats. An older KVScope reads the chat's
sampling settings and ignores the key. "Use for new chats" does not carry it: a schema belongs to
one chat's task, not to the app's defaults.

A reply on this engine gets `structured_outputs` (the engine masks every token to the schema);
one from an OpenAI-compatible server gets OpenAI's `response_format`. With it on, a reply that is
JSON is shown indented in a code block; the stored text stays what the model wrote.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KEY = "structured_output"  # its entry in a chat's sampling JSON
SCHEMA_NAME = "schema"  # response_format's json_schema.name, which OpenAI requires


@dataclass(frozen=True)
class StructuredOutput:
    on: bool = False
    schema: str = ""  # as typed

    @classmethod
    def from_sampling(cls, sampling: object) -> StructuredOutput:
        """A chat's setting from its stored sampling JSON; off for none or a damaged entry."""
        entry = sampling.get(KEY) if isinstance(sampling, dict) else None
        if not isinstance(entry, dict):
            return cls()
        schema = entry.get("schema")
        return cls(entry.get("on") is True, schema if isinstance(schema, str) else "")


def with_structured(sampling: dict, structured: StructuredOutput) -> dict:
    """A chat's sampling JSON with `structured` in it (a copy). Off with nothing typed is left
    out, so a chat that never used it stores what it stored before."""
    merged = {key: value for key, value in sampling.items() if key != KEY}
    if structured.on or structured.schema:
        merged[KEY] = {"on": structured.on, "schema": structured.schema}
    return merged


def parse_schema(text: str) -> dict[str, Any]:
    """The typed schema as a JSON object; ValueError saying what is wrong and where."""
    if not text.strip():
        raise ValueError("No schema: type a JSON Schema, or turn structured output off.")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"Not valid JSON: {e.msg} (line {e.lineno}, column {e.colno}).") from None
    except RecursionError:
        raise ValueError("Not valid JSON: it is nested too deeply.") from None
    if not isinstance(value, dict):
        raise ValueError(f"A JSON Schema is a JSON object ({{…}}), not {_kind(value)}.")
    return value


def reply_fields(schema: dict[str, Any], on_engine: bool) -> dict[str, Any]:
    """What a reply's parameters take for the schema: this engine's `structured_outputs`, or
    the `response_format` of an OpenAI-compatible server's request body."""
    if on_engine:
        from kvscope.engine import StructuredOutputsParams

        return {"structured_outputs": StructuredOutputsParams(json=schema)}
    return {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": SCHEMA_NAME, "schema": schema},
        }
    }


def json_markdown(text: str) -> str | None:
    """A reply that is JSON, indented in a json code block (markdown); None for other text."""
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    # Indented JSON escapes newlines inside strings and starts every line with a space or a
    # bracket, so no line of it can close the fence.
    return f"```json\n{json.dumps(value, indent=2, ensure_ascii=False)}\n```"


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    return "a number"
