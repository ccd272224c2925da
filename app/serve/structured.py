"""A request's structured-output fields, read as vLLM 0.33 reads them: `response_format`
(OpenAI's text, json_object, json_schema) over `structured_outputs` (vLLM's json, regex, choice,
grammar, json_object), into the engine's StructuredOutputsParams; compiled off the event loop
within a time budget."""

from __future__ import annotations

import asyncio
from dataclasses import fields
from typing import Any

from kvscope.app.serve.errors import APIError
from kvscope.engine import GrammarError, LLMEngine, ParamError, StructuredOutputsParams

COMPILE_SECONDS = 5.0  # llguidance's limits stop a runaway grammar; this bounds the wait
_FIELDS = {f.name for f in fields(StructuredOutputsParams)}


def read_structured_outputs(
    response_format: Any, structured_outputs: Any
) -> StructuredOutputsParams | None:
    overrides: dict[str, Any] = {}
    if response_format is not None:
        overrides = _response_format(response_format)
    if structured_outputs is None and not overrides:
        return None
    given: dict[str, Any] = {}
    if structured_outputs is not None:
        if not isinstance(structured_outputs, dict):
            raise APIError(400, "structured_outputs must be an object", "structured_outputs")
        unknown = sorted(set(structured_outputs) - _FIELDS)
        if unknown:
            raise APIError(
                400, f"structured_outputs has unknown fields {unknown}", "structured_outputs"
            )
        given = {k: v for k, v in structured_outputs.items() if v is not None}
    if overrides:  # vLLM: response_format replaces whatever constraint structured_outputs set
        for name in ("json", "regex", "choice", "grammar", "json_object", "structural_tag"):
            given.pop(name, None)
        given.update(overrides)
    try:
        return StructuredOutputsParams(**given)
    except ParamError as e:
        raise APIError(400, str(e), "structured_outputs") from None
    except TypeError as e:
        raise APIError(400, f"structured_outputs: {e}", "structured_outputs") from None


def _response_format(raw: Any) -> dict[str, Any]:
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = raw.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise APIError(
                400,
                'response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}',
                "response_format",
            )
        return {"json": schema}
    raise APIError(
        400,
        f"response_format type must be text, json_object or json_schema, got {kind!r}",
        "response_format",
    )


async def compile_off_loop(engine: LLMEngine, params: StructuredOutputsParams, param: str) -> None:
    """Compile (and cache) the grammar in a worker thread; a 400 naming `param` when it cannot
    be compiled, or not within COMPILE_SECONDS. The engine thread then finds it compiled."""
    try:
        # The model's vocabulary is wrapped once, on first use; it is not the request's cost.
        await asyncio.to_thread(lambda: engine.grammars.tokenizer)
        await asyncio.wait_for(asyncio.to_thread(engine.grammars.compile, params), COMPILE_SECONDS)
    except GrammarError as e:
        raise APIError(400, str(e), param) from None
    except TimeoutError:
        raise APIError(
            400, f"the grammar did not compile within {COMPILE_SECONDS:g} s", param
        ) from None
