"""A chat reply with tools, as OpenAI answers it: `tool_calls` (ids, names, arguments as a JSON
string) in a whole message, or streamed as OpenAI streams them (a call's id and name first,
then its arguments in pieces)."""

from __future__ import annotations

import secrets
from typing import Any

from kvscope.app.serve.tools.formats import PartialCall, ToolFormat


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


def tool_call(call: PartialCall) -> dict[str, Any]:
    return {
        "id": call_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def message(fmt: ToolFormat, text: str) -> tuple[dict[str, Any], bool]:
    """The whole reply as an assistant message, and whether it calls tools."""
    scan = fmt.scan(text)
    calls = [tool_call(c) for c in scan.calls if c.name is not None]
    if not calls:
        # No call: the text is the answer (a generic reply's {"response"} already unwrapped).
        return {"role": "assistant", "content": scan.content}, False
    return {"role": "assistant", "content": scan.content or None, "tool_calls": calls}, True


class ToolCallDeltas:
    """One choice's stream: what of its content and calls has been sent."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self.content_sent = 0
        self.calls_sent: list[int] = []  # per call begun: characters of arguments sent
        self.any_call = False

    def step(self, text: str) -> dict[str, Any]:
        """The delta that brings the client up to `text` ({} when nothing is new)."""
        scan = self.fmt.scan(text)
        delta: dict[str, Any] = {}
        if len(scan.content) > self.content_sent:
            delta["content"] = scan.content[self.content_sent :]
            self.content_sent = len(scan.content)
        pieces = []
        for i, call in enumerate(scan.calls):
            if call.name is None:
                break
            if i == len(self.calls_sent):
                self.calls_sent.append(0)
                self.any_call = True
                function = {"name": call.name, "arguments": ""}
                pieces.append(
                    {"index": i, "id": call_id(), "type": "function", "function": function}
                )
            new = call.arguments[self.calls_sent[i] :]
            if new:
                self.calls_sent[i] = len(call.arguments)
                pieces.append({"index": i, "function": {"arguments": new}})
        if pieces:
            delta["tool_calls"] = pieces
        return delta
