"""What a chat request asks of tools: the tools, the choice, the model's call format, and from
them the prompt's messages and the grammar of the reply."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvscope.app.serve.tools.formats import ToolFormat, pick_format
from kvscope.app.serve.tools.messages import template_messages
from kvscope.app.serve.tools.spec import Tool, ToolChoice, read_tool_choice, read_tools


@dataclass(frozen=True)
class ToolRequest:
    tools: list[Tool]
    choice: ToolChoice
    format: ToolFormat

    @classmethod
    def read(
        cls,
        tools: list[Any] | None,
        tool_choice: Any,
        parallel_tool_calls: bool | None,
        messages: list[dict[str, Any]],
        chat_template: object,
    ) -> ToolRequest | None:
        """None for a chat with no tools and no tool turns in its history."""
        read = read_tools(tools)
        choice = read_tool_choice(tool_choice, read, parallel_tool_calls)
        history = any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
        if not read and not history:
            return None
        return cls(read, choice, pick_format(chat_template))

    @property
    def calls_allowed(self) -> bool:
        return self.choice.calls_allowed and bool(self.tools)

    def prompt(self, messages: list[dict[str, Any]]) -> tuple[list[dict], list[dict] | None]:
        """The messages and tools for the chat template."""
        return template_messages(messages, self.format, self.tools, self.choice)

    def grammar(self) -> str:
        return self.format.grammar(self.tools, self.choice)
