"""The engine and sampling flags of the command line, below everything that reads them.

`kvscope generate/chat/record/serve` take EngineConfig's CLI knobs as flags, and the serve bench
passes the same flags to the server it starts; the parser (app/cli/main.py), the server
(app/serve/server.py) and the bench (app/bench/serving/bench.py) all read this one list, so none of
them imports another.
"""

from __future__ import annotations

import argparse
from dataclasses import Field

from kvscope.engine import LLM
from kvscope.engine.config import KNOB, user_knobs


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


def llm_from_args(args: argparse.Namespace) -> LLM:
    """An engine from the engine flags of the terminal subcommands."""
    return LLM(**{f.name: getattr(args, f.name) for f in engine_knobs()})
