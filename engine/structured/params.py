"""StructuredOutputsParams: what a request constrains its output to, with vLLM's fields and
vLLM's rule (exactly one constraint), turned into the grammar text the matcher compiles."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvscope.engine.param_error import ParamError

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# The grammar text of `json_object`: any JSON object, as OpenAI's json_object mode promises.
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class StructuredOutputsParams:
    """vLLM's StructuredOutputsParams: one of json (a JSON Schema), regex, choice, grammar
    (Lark, as llguidance reads it) or json_object; structural_tag is refused."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        given = [name for name in _CONSTRAINTS if getattr(self, name) is not None]
        if len(given) != 1:
            raise ParamError(
                "structured_outputs",
                "structured_outputs takes exactly one of json, regex, choice, grammar or "
                f"json_object, got {given or 'none'}",
            )
        if self.structural_tag is not None:
            raise ParamError("structured_outputs", "structural_tag is not supported")
        if self.json_object is False:
            raise ParamError("structured_outputs", "json_object must be true when given")
        if self.choice is not None and (
            not isinstance(self.choice, list)
            or not self.choice
            or not all(isinstance(c, str) for c in self.choice)
        ):
            raise ParamError("structured_outputs", "choice must be a non-empty list of strings")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ParamError("structured_outputs", f"{name} must be a non-empty string")

    def grammar_text(self) -> str:
        """llguidance's grammar for this constraint (not yet checked: compiling checks it)."""
        from llguidance import LLMatcher, grammar_from

        if self.json is not None or self.json_object:
            schema = _ANY_OBJECT if self.json_object else self.json
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except ValueError as e:
                    raise ParamError("structured_outputs", f"json is not valid JSON: {e}") from None
            if not isinstance(schema, dict):
                raise ParamError("structured_outputs", "a JSON Schema must be a JSON object")
            if not self.json_object:
                # As xgrammar's strict mode, vLLM's default backend: an object that lists its
                # properties takes only those, unless the schema says otherwise. Every reply
                # still validates, and a small model cannot add keys until max_tokens.
                schema = close_object_schemas(schema)
            return LLMatcher.grammar_from_json_schema(schema, overrides=self._json_options())
        if self.regex is not None:
            return grammar_from("regex", self.regex)
        if self.choice is not None:
            return grammar_from("choice", json.dumps(self.choice))
        assert self.grammar is not None  # __post_init__: exactly one constraint is set
        return grammar_from("lark", self.grammar)

    def _json_options(self) -> JsonCompileOptions:
        # Compact JSON unless a whitespace pattern is asked for: with free whitespace a small
        # model can emit newlines until max_tokens and never close the object. So
        # disable_any_whitespace (vLLM's opt-in) is what every request gets here.
        if self.whitespace_pattern is not None:
            return {"whitespace_flexible": True, "whitespace_pattern": self.whitespace_pattern}
        return {"whitespace_flexible": False}


def close_object_schemas(schema: Any) -> Any:
    """vLLM's disable_additional_properties: every object schema that lists its properties and
    says nothing of others gets additionalProperties: false (a copy; the caller's is kept)."""
    if isinstance(schema, list):
        return [close_object_schemas(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: close_object_schemas(value) for key, value in schema.items()}
    if (
        "properties" in closed
        and "additionalProperties" not in closed
        and "patternProperties" not in closed
    ):
        closed["additionalProperties"] = False
    return closed


_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
