"""How a model writes tool calls, per chat-template family: what grammar constrains its reply
and how the reply reads back as content and calls (whole, or while it is still being written).

- hermes: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` blocks, the format
  of Qwen 2.5 / 3, Hermes and others whose templates render `tools` and say `<tool_call>`.
- llama3_json: a bare `{"name": ..., "parameters": {...}}`, Llama 3.1 / 3.2 / 3.3's and
  Llama 4's JSON templates'.
- generic: any other model (llama.cpp's generic handler does the same). The tools are described
  in the system message and the reply is one JSON object: {"tool_calls": [...]} or
  {"response": "..."}.

With the grammar in place, every reply parses: the model chooses what to say, never the syntax.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from kvscope.app.serve.tools import json_scan
from kvscope.app.serve.tools.schemas import COMPACT, call_schemas, one_of_calls
from kvscope.app.serve.tools.spec import Tool, ToolChoice

# The most calls one reply may make: a small model asked for parallel calls otherwise repeats
# the same call until max_tokens (seen on the bundled 135M model).
MAX_PARALLEL_CALLS = 8


@dataclass
class PartialCall:
    name: str | None  # None until its name is complete
    arguments: str = ""  # the arguments' JSON text so far
    done: bool = False


@dataclass
class Scan:
    """A reply read so far: content safe to show, and the calls begun."""

    content: str = ""
    calls: list[PartialCall] = field(default_factory=list)


def _lark_json(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps(schema, separators=(",", ":"))


def _scan_call(text: str, i: int, args_key: str) -> tuple[PartialCall | None, int | None]:
    """The call object starting at text[i] (None when not begun), and where it ends (None
    while it is open)."""
    j = json_scan.expect(text, i, "{")
    if j is None:
        return None, None
    j = json_scan.expect(text, j, '"name"')
    j = json_scan.expect(text, j, ":") if j is not None else None
    if j is None:
        return PartialCall(None), None
    j = json_scan.skip_space(text, j)
    name, closed = json_scan.partial_string(text, j)
    if not closed:
        return PartialCall(None), None
    name_end = json_scan.string_end(text, j)
    assert name_end is not None
    j = json_scan.expect(text, name_end, ",")
    j = json_scan.expect(text, j, f'"{args_key}"') if j is not None else None
    j = json_scan.expect(text, j, ":") if j is not None else None
    if j is None:
        return PartialCall(name), None
    start = json_scan.skip_space(text, j)
    end = json_scan.value_end(text, start)
    if end is None:
        return PartialCall(name, text[start:]), None
    close = json_scan.expect(text, end, "}")
    return PartialCall(name, text[start:end], close is not None), close


class ToolFormat(ABC):
    name: str
    native: bool  # the template renders the tools (else they go in the system message)
    args_key = "arguments"

    @abstractmethod
    def grammar(self, tools: list[Tool], choice: ToolChoice) -> str:
        """The Lark grammar (llguidance's dialect) every reply must follow."""

    @abstractmethod
    def scan(self, text: str) -> Scan:
        """The reply so far as content and calls."""


class HermesFormat(ToolFormat):
    name = "hermes"
    native = True
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def grammar(self, tools: list[Tool], choice: ToolChoice) -> str:
        chosen = [t for t in tools if choice.mode != "named" or t.name == choice.name]
        more = MAX_PARALLEL_CALLS - 1
        calls = f'call ("\\n" call){{0,{more}}}' if choice.parallel else "call"
        rules = [
            f"calls: {calls}",
            f'call: "{self.OPEN}\\n" {_lark_json(one_of_calls(chosen, self.args_key))} '
            f'"\\n{self.CLOSE}"',
        ]
        if choice.mode == "auto":
            # Text that does not open with a call: a reply is one or the other, never both.
            rules += ["start: calls | TEXT", f"TEXT: /(?s:.+)/ & ~/(?s:{self.OPEN}.*)/"]
        else:
            rules.insert(0, "start: calls")
        return "\n".join(rules)

    def scan(self, text: str) -> Scan:
        if not text.startswith(self.OPEN):
            # Hold back what may still become "<tool_call>".
            return Scan("" if self.OPEN.startswith(text) else text)
        calls: list[PartialCall] = []
        i = 0
        while True:
            j = json_scan.expect(text, i, self.OPEN)
            if j is None:
                break
            call, end = _scan_call(text, j, self.args_key)
            if call is None:
                break
            calls.append(call)
            close = json_scan.expect(text, end, self.CLOSE) if end is not None else None
            if close is None:
                break
            i = close
        return Scan("", calls)


class Llama3JsonFormat(ToolFormat):
    name = "llama3_json"
    native = True
    args_key = "parameters"

    def grammar(self, tools: list[Tool], choice: ToolChoice) -> str:
        chosen = [t for t in tools if choice.mode != "named" or t.name == choice.name]
        call = _lark_json(one_of_calls(chosen, self.args_key))
        if choice.mode == "auto":
            # One call per reply, as Llama 3's format has it; text is anything else.
            return f"start: {call} | TEXT\nTEXT: /(?s:.+)/ & ~/(?s:\\{{.*)/"
        return f"start: {call}"

    def scan(self, text: str) -> Scan:
        if not text.lstrip().startswith("{"):
            return Scan(text)
        call, _ = _scan_call(text, 0, self.args_key)
        return Scan("", [call] if call is not None else [])


class GenericFormat(ToolFormat):
    name = "generic"
    native = False

    def grammar(self, tools: list[Tool], choice: ToolChoice) -> str:
        chosen = [t for t in tools if choice.mode != "named" or t.name == choice.name]
        schemas, defs = call_schemas(chosen, self.args_key)
        items = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        most = MAX_PARALLEL_CALLS if choice.parallel else 1
        array: dict[str, Any] = {"type": "array", "items": items, "minItems": 1, "maxItems": most}
        calls = _object({"tool_calls": array})
        schema = calls if choice.mode != "auto" else {"anyOf": [calls, _object(RESPONSE)]}
        return "start: " + _lark_json({**schema, "$defs": defs, "x-guidance": COMPACT})

    def scan(self, text: str) -> Scan:
        j = json_scan.expect(text, 0, "{")
        key_start = json_scan.skip_space(text, j) if j is not None else None
        if key_start is None or key_start >= len(text):
            return Scan()
        key, closed = json_scan.partial_string(text, key_start)
        if not closed:
            return Scan()
        after_key = json_scan.expect(text, json_scan.string_end(text, key_start) or 0, ":")
        if after_key is None:
            return Scan()
        value = json_scan.skip_space(text, after_key)
        if key == "response":
            if value >= len(text):
                return Scan()
            return Scan(json_scan.partial_string(text, value)[0])
        calls: list[PartialCall] = []
        i = json_scan.expect(text, value, "[")
        while i is not None:
            call, end = _scan_call(text, i, self.args_key)
            if call is None:
                break
            calls.append(call)
            i = json_scan.expect(text, end, ",") if end is not None else None
        return Scan("", calls)


RESPONSE = {"response": {"type": "string"}}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _json_key(key: str) -> re.Pattern[str]:
    """`"key"` as a template writes a JSON call, its quotes escaped or not (Qwen 3 writes
    {\"name\": <function-name>, \"arguments\": ...} inside a double-quoted Jinja string, and
    a dict of templates is read as its JSON)."""
    return re.compile(rf'"{key}\\*"')


_ARGUMENTS, _PARAMETERS = _json_key("arguments"), _json_key("parameters")


def pick_format(template: object) -> ToolFormat:
    """The format the model's chat template teaches it, read from the template's text.

    hermes wants `<tool_call>` around a JSON call: Qwen 3.5, Qwen3-Coder and GLM 4.5 also say
    `<tool_call>`, around XML-like parameters we do not speak (generic for them). llama3_json
    is Llama 3.x's `<|eot_id|>` or Llama 4's `<|eot|>` with a JSON `"parameters"` call (their
    pythonic templates are generic)."""
    text = json.dumps(template) if isinstance(template, dict) else str(template or "")
    renders_tools = "tools" in text
    if renders_tools and "<tool_call>" in text and _ARGUMENTS.search(text):
        return HermesFormat()
    llama = "<|eot_id|>" in text or "<|eot|>" in text
    if renders_tools and llama and _PARAMETERS.search(text):
        return Llama3JsonFormat()
    return GenericFormat()
