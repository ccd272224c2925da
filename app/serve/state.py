"""What the routes share: the engine, its driver, the metrics, the names it answers to."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kvscope.app.serve.engine_loop import EngineDriver
from kvscope.app.serve.metrics import ServerMetrics
from kvscope.app.serve.responses import TokenText
from kvscope.engine import LLMEngine


@dataclass
class ServerState:
    engine: LLMEngine
    driver: EngineDriver  # the engine's queue: requests, aborts and calls between steps
    metrics: ServerMetrics
    model_names: tuple[str, ...]
    max_model_len: int
    token_text: TokenText
    # Characters of the longest vocabulary entry: a token spells at most this many of a text
    # prompt's characters (the bound behind max_prompt_chars and truncation's cut).
    longest_token_chars: int
    started: int = field(default_factory=lambda: int(time.time()))

    @property
    def max_prompt_chars(self) -> int:
        """No prompt longer than this many characters can fit max_model_len tokens: checked
        before any tokenizing or templating."""
        return self.max_model_len * self.longest_token_chars
