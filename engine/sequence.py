"""Per-request and per-sample state the scheduler and the engine move around."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from kvscope.engine.detokenizer import IncrementalDetokenizer, StopChecker
from kvscope.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from kvscope.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from kvscope.engine.model.sampler import SampleResult
    from kvscope.engine.structured.compiler import GrammarMatcher


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
    # None for beam search's sequences, which BeamSearchRunner decodes itself.
    detokenizer: IncrementalDetokenizer | None
    generator: torch.Generator | None
    seq_id: int = field(default_factory=lambda: next(_seq_ids))
    num_computed_tokens: int = 0
    num_cached_tokens: int | None = None  # prefix-cache hit at first admission
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None  # set when the engine failed this sequence (finish "abort")
    num_preemptions: int = 0
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float = 0.0
    # Where the output text ends when a stop string cut it (before the stop string, or after
    # it with include_stop_str_in_output).
    text_end: int | None = None
    # Where a structured-output sample stands in its grammar; it survives preemption, since
    # recomputing the K/V of tokens it already took samples nothing.
    grammar: GrammarMatcher | None = None

    @property
    def text_decoder(self) -> IncrementalDetokenizer:
        """The detokenizer of a sequence that makes text (every one but beam search's)."""
        assert self.detokenizer is not None, "a beam search sequence has no text of its own"
        return self.detokenizer

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
        text = self.text_decoder.output_text
        if self.is_finished:
            return text if self.text_end is None else text[: self.text_end]
        return self.request.stop_checker.streamable(text)

    def append_token(
        self, result: SampleResult, now: float, eos_token_ids: set[int], max_seq_len: int
    ) -> str | None:
        """Take the sampled token; returns why the sequence is done ("stop", "length") or None."""
        params = self.request.params
        token = result.token_id
        self.token_ids.append(token)
        self.cumulative_logprob += result.logprob
        # top_logprobs is set exactly when the request asked for logprobs (the sampler's rule).
        if self.logprobs is not None and result.top_logprobs is not None:
            self.logprobs.append(result.top_logprobs)
        if self.request.metrics.first_token_time is None:
            self.request.metrics.first_token_time = now
        reason = None
        if token in eos_token_ids and not params.ignore_eos:
            reason = "stop"
        elif token in (params.stop_token_ids or ()):
            reason, self.stop_reason = "stop", token
        # As vLLM: the token that stopped it is left out of the text unless asked for.
        if reason is None or params.include_stop_str_in_output:
            delta = self.text_decoder.step([token])
        else:
            delta = ""
        # Stop strings count only once min_tokens are out (vLLM's rule).
        if delta and params.stop and reason is None and self.num_output_tokens > params.min_tokens:
            hit = self.request.stop_checker.find(self.text_decoder.output_text, len(delta))
            if hit is not None:
                reason, self.stop_reason = "stop", hit.stop
                # Cut before the stop string, or after it when it is to be kept.
                keep = len(hit.stop) if params.include_stop_str_in_output else 0
                self.text_end = hit.index + keep
        if reason is None and (
            self.num_output_tokens >= params.max_tokens or self.num_tokens >= max_seq_len
        ):
            reason = "length"
        if reason is not None and self.text_end is None:
            self.text_decoder.flush()  # a character cut off by max_tokens still shows up
        return reason

    def output(self) -> CompletionOutput:
        return CompletionOutput(
            index=self.index,
            text=self.visible_text,
            token_ids=list(self.output_token_ids),
            finish_reason=self.finish_reason,
            logprobs=list(self.logprobs) if self.logprobs is not None else None,
            stop_reason=self.stop_reason,
            cumulative_logprob=self.cumulative_logprob,
            error=self.error,
            num_preemptions=self.num_preemptions,
        )


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
    # Engine steps of its milestones, for the traffic trace (engine.trace); 0 until reached.
    first_scheduled_step: int = 0
    first_token_step: int = 0
    stop_checker: StopChecker = field(init=False)

    def __post_init__(self) -> None:
        self.stop_checker = StopChecker(self.params.stop or [])

    @property
    def is_finished(self) -> bool:
        return all(s.is_finished for s in self.sequences)

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache when the request was first admitted."""
        return self.sequences[0].num_cached_tokens or 0

    def output(self) -> RequestOutput:
        """Where the request stands now, cumulative over everything generated so far."""
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=list(self.prompt_token_ids),
            outputs=[seq.output() for seq in self.sequences],
            finished=self.is_finished,
            num_cached_tokens=self.num_cached_tokens,
            metrics=self.metrics,
        )
