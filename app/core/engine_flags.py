"""The engine and sampling flags of the command line, below everything that reads them.

`kvscope generate/chat/record/serve` take EngineConfig's CLI knobs as flags, and the serve bench
passes the same flags to the server it starts; the parser (app/cli/main.py), the server
(app/serve/server.py) and the bench (app/bench/serving/bench.py) all read this one list, so none of
them imports another.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import Field

from kvscope.app.core.defaults import default_max_model_len
from kvscope.engine import LLM
from kvscope.engine.config import KNOB, EngineConfig, user_knobs


def engine_knobs() -> list[Field]:
    """EngineConfig's fields that `generate`, `chat` and `record` take as flags."""
    return [f for f in user_knobs() if f.metadata[KNOB].cli]


# SamplingParams fields the terminal commands take, as (type, default): greedy unless told.
SAMPLING_FLAGS = {
    "max_tokens": (int, 256),
    "temperature": (float, 0.0),
    "top_p": (float, 1.0),
    "top_k": (int, -1),
    "seed": (int, None),
}


def llm_from_args(args: argparse.Namespace, progress: Callable[[str], None] | None = None) -> LLM:
    """An engine from the engine flags of the terminal subcommands, with the product's default
    context where `--max-model-len` is not given (read from the model's header, so the model
    loads first); `progress(words)` hears each slow stage as it starts."""
    from kvscope.engine.model.loader import LoadedModel, load_model

    knobs = _knobs(args)
    model = knobs.pop("model")
    if knobs["max_model_len"] is not None and progress is None:
        return LLM(model=model, **knobs)
    say = progress or (lambda _words: None)
    if not isinstance(model, LoadedModel):  # a caller may hand over a model it loaded
        say("reading the model's header and tokenizer")
        model = load_model(model, progress)
    if knobs["max_model_len"] is None:
        context = model.config.max_position_embeddings
        knobs["max_model_len"] = default_max_model_len(context)
    say("loading the weights and sizing the KV pool")
    return LLM(model=model, **knobs)


def check_engine_flags(args: argparse.Namespace) -> None:
    """Raise ValueError naming a bad engine flag, without loading anything."""
    EngineConfig(**_knobs(args))


def _knobs(args: argparse.Namespace) -> dict:
    return {f.name: getattr(args, f.name) for f in engine_knobs()}
