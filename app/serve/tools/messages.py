"""A chat's history, with OpenAI's tool messages, as the model's template should see it.

A template that renders tools (hermes, llama3_json) gets assistant messages with `tool_calls`
(arguments as objects, as transformers' templates expect) and `tool` messages as they are.
Any other template gets plain turns: the tools described in the system message, past calls as
the JSON the model writes, and results as user turns (a template that insists on alternating
user and assistant turns still renders them)."""

from __future__ import annotations

import json
from typing import Any

from kvscope.app.serve.errors import APIError
from kvscope.app.serve.tools.formats import ToolFormat
from kvscope.app.serve.tools.spec import Tool, ToolChoice

Message = dict[str, Any]


def _arguments(raw: Any, where: str) -> Any:
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        raise APIError(400, f"{where} must be a JSON string", where)
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        raise APIError(400, f"{where} is not valid JSON", where) from None


def _calls(message: Message, index: int) -> list[dict[str, Any]]:
    calls = []
    for j, call in enumerate(message.get("tool_calls") or []):
        where = f"messages[{index}].tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise APIError(400, f"{where} needs function.name", where)
        arguments = _arguments(function.get("arguments", "{}"), f"{where}.function.arguments")
        calls.append({"id": call.get("id"), "name": function["name"], "arguments": arguments})
    return calls


def template_messages(
    messages: list[Message], fmt: ToolFormat, tools: list[Tool], choice: ToolChoice
) -> tuple[list[Message], list[dict[str, Any]] | None]:
    """(messages, tools) for the chat template."""
    if fmt.native:
        return _native(messages), [t.to_openai() for t in tools] if choice.calls_allowed else None
    return _generic(messages, tools, choice), None


def _native(messages: list[Message]) -> list[Message]:
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        if m["role"] == "assistant" and m.get("tool_calls"):
            m["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in _calls(m, i)
            ]
            m["content"] = m.get("content") or ""
        out.append(m)
    return out


def _generic(messages: list[Message], tools: list[Tool], choice: ToolChoice) -> list[Message]:
    names = {}  # call id -> tool name, to say whose result a tool message is
    turns: list[Message] = []
    for i, m in enumerate(messages):
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = _calls(m, i)
            names.update({c["id"]: c["name"] for c in calls})
            written = [{"name": c["name"], "arguments": c["arguments"]} for c in calls]
            content = json.dumps({"tool_calls": written})
        elif role == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id"), "a tool")
            role, content = "user", f"Result of {name}: {content}"
        if turns and turns[-1]["role"] == role and role != "system":
            turns[-1] = {"role": role, "content": f"{turns[-1]['content']}\n\n{content}"}
        else:
            turns.append({"role": role, "content": content})
    if not choice.calls_allowed:
        return turns
    guide = tools_system_text(tools, choice)
    if turns and turns[0]["role"] == "system":
        turns[0] = {"role": "system", "content": f"{turns[0]['content']}\n\n{guide}"}
    else:
        turns.insert(0, {"role": "system", "content": guide})
    return turns


def tools_system_text(tools: list[Tool], choice: ToolChoice) -> str:
    listed = json.dumps(
        [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools]
    )
    lines = [
        "You can call these tools (their parameters are JSON Schemas):",
        listed,
        'To call tools, reply with only this JSON: {"tool_calls": [{"name": "<tool name>", '
        '"arguments": {<the arguments>}}]}',
    ]
    if choice.mode == "auto":
        lines.append('To answer without a tool, reply with only {"response": "<your answer>"}')
    elif choice.mode == "named":
        lines.append(f"You must call the tool {choice.name}.")
    else:
        lines.append("You must call at least one tool.")
    return "\n".join(lines)
