"""JSON Schemas of tool calls, for the grammars that constrain them.

A tool's parameters schema (its objects closed to the properties they list) is placed under
`$defs` of the call's schema and every `$ref` inside it re-pointed there: a `#/$defs/X`
written against the tool's own root (as pydantic writes nested models) must not resolve
against the wrapper."""

from __future__ import annotations

from typing import Any

from kvscope.app.serve.tools.spec import Tool
from kvscope.engine import close_object_schemas

COMPACT = {"whitespace_flexible": False}  # llguidance's option: no free whitespace in JSON


def _repoint(value: Any, root: str) -> Any:
    if isinstance(value, list):
        return [_repoint(v, root) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: _repoint(v, root) for k, v in value.items()}
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = root + ref[1:]
    return out


def call_schemas(tools: list[Tool], args_key: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One object schema per tool, {"name": <its name>, args_key: <its parameters>} in that
    order, and the $defs they point into."""
    schemas, defs = [], {}
    for i, tool in enumerate(tools):
        key = f"tool{i}"
        # Objects take only the properties they list: what a call says is what the tool
        # declares (a small model otherwise invents keys until max_tokens).
        defs[key] = _repoint(close_object_schemas(tool.parameters), f"#/$defs/{key}")
        schemas.append(
            {
                "type": "object",
                "properties": {"name": {"const": tool.name}, args_key: {"$ref": f"#/$defs/{key}"}},
                "required": ["name", args_key],
                "additionalProperties": False,
            }
        )
    return schemas, defs


def one_of_calls(tools: list[Tool], args_key: str) -> dict[str, Any]:
    """A schema for one call of any of `tools`."""
    schemas, defs = call_schemas(tools, args_key)
    body = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return {**body, "$defs": defs, "x-guidance": COMPACT}
