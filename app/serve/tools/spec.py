"""A request's tools and tool_choice, checked as OpenAI and vLLM check them (every error a 400
that names the field)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from kvscope.app.serve.errors import APIError

# OpenAI's rules: names of letters, digits, _ and -, at most 64; at most 128 tools a request.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 128
MAX_TOOLS_JSON_CHARS = 256 * 1024  # every tool's description and schema, as JSON


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON Schema for the arguments object

    def to_openai(self) -> dict[str, Any]:
        """The tool as OpenAI sends it (what chat templates expect to iterate)."""
        function = {"name": self.name, "description": self.description}
        return {"type": "function", "function": {**function, "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolChoice:
    mode: Literal["none", "auto", "required", "named"]
    name: str | None = None  # the function a named choice calls
    parallel: bool = True  # more than one call per reply (parallel_tool_calls)

    @property
    def calls_allowed(self) -> bool:
        return self.mode != "none"


def read_tools(raw: list[Any] | None) -> list[Tool]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not raw:
        raise APIError(400, "tools must be a non-empty list when given", "tools")
    if len(raw) > MAX_TOOLS:
        raise APIError(400, f"at most {MAX_TOOLS} tools are taken, got {len(raw):,}", "tools")
    if len(json.dumps(raw)) > MAX_TOOLS_JSON_CHARS:
        raise APIError(
            400, f"the tools are over {MAX_TOOLS_JSON_CHARS:,} characters of JSON", "tools"
        )
    tools: list[Tool] = []
    for i, item in enumerate(raw):
        where = f"tools[{i}]"
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(item, dict) or item.get("type") != "function":
            raise APIError(400, f'{where} must be {{"type": "function", "function": ...}}', where)
        if not isinstance(function, dict):
            raise APIError(400, f"{where}.function must be an object", f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise APIError(
                400,
                f"{where}.function.name must be 1-64 letters, digits, _ or -, got "
                f"{json.dumps(name)[:80]}",
                f"{where}.function.name",
            )
        if any(t.name == name for t in tools):
            raise APIError(400, f"two tools are named {name!r}", f"{where}.function.name")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise APIError(
                400,
                f"{where}.function.parameters must be a JSON Schema object",
                f"{where}.function.parameters",
            )
        if not parameters:
            parameters = {"type": "object", "properties": {}}
        description = function.get("description") or ""
        if not isinstance(description, str):
            raise APIError(
                400,
                f"{where}.function.description must be a string",
                f"{where}.function.description",
            )
        tools.append(Tool(name, description, parameters))
    return tools


def read_tool_choice(raw: Any, tools: list[Tool], parallel: bool | None) -> ToolChoice:
    """vLLM's defaults: "auto" when tools are given, "none" without."""
    if raw is None:
        raw = "auto" if tools else "none"
    parallel = parallel is not False
    if raw == "none":
        return ToolChoice("none", parallel=parallel)
    if not tools:
        raise APIError(400, "When using `tool_choice`, `tools` must be set.", "tool_choice")
    if raw in ("auto", "required"):
        return ToolChoice(raw, parallel=parallel)
    function = raw.get("function") if isinstance(raw, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise APIError(
            400,
            'tool_choice must be "none", "auto", "required" or '
            '{"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    if not any(t.name == name for t in tools):
        raise APIError(
            400, f"tool_choice names {name[:80]!r}, which is not one of the tools", "tool_choice"
        )
    return ToolChoice("named", name, parallel=False)
