"""What generation hands back: per-request outputs (vLLM-shaped) and beam-search results."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """Wall-clock times (time.time()) of a request's milestones; None until reached."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class CompletionOutput:
    """One sample of a request, cumulative: text and token_ids cover everything generated so far."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort"; None while running
    # Per generated token: token id -> raw logprob, the sampled token always among them.
    logprobs: list[dict[int, float]] | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    cumulative_logprob: float | None = None
    error: str | None = None  # why it was aborted when the engine failed it (finish "abort")
    num_preemptions: int = 0  # times the scheduler took this sample's blocks back (recompute)

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
    metrics: RequestMetrics | None = None


@dataclass
class BeamSequence:
    token_ids: list[int]  # generated tokens only
    cum_logprob: float
    text: str


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSequence] = field(default_factory=list)  # best first
