"""Per-request and per-sample state the scheduler and the engine move around."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

import torch

from engine.detokenizer import IncrementalDetokenizer, StopChecker
from engine.outputs import RequestMetrics
from engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again after its blocks were taken back
    FINISHED = "finished"


_seq_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    """One sample of a request: its tokens, how many have K/V in the pool, and its output state."""

    request: Request
    index: int
    token_ids: list[int]
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator | None
    seq_id: int = field(default_factory=lambda: next(_seq_ids))
    num_computed_tokens: int = 0
    num_cached_tokens: int | None = None  # prefix-cache hit at first admission
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None  # set when the engine failed this sequence (finish "abort")
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float = 0.0
    # Where the output text ends when a stop string cut it (the stop string is excluded).
    text_end: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def visible_text(self) -> str:
        """Final text once finished; while running, all but a tail that may become a stop string."""
        text = self.detokenizer.output_text
        if self.is_finished:
            return text if self.text_end is None else text[: self.text_end]
        return self.request.stop_checker.streamable(text)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics
    sequences: list[Sequence] = field(default_factory=list)
    # Samples (n > 1) that will fork from sequences[0] when its prompt is computed.
    pending_forks: list[Sequence] = field(default_factory=list)
    stop_checker: StopChecker = field(init=False)

    def __post_init__(self) -> None:
        self.stop_checker = StopChecker(self.params.stop)

    @property
    def is_finished(self) -> bool:
        return all(s.is_finished for s in self.sequences)

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache when the request was first admitted."""
        return self.sequences[0].num_cached_tokens or 0
