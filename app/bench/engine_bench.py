"""Our engine under the benchmark: the whole workload at once, and batch-1 decode steps."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from kvscope.engine import LLM, RequestOutput, SamplingParams


@dataclass
class EngineWorkloadResult:
    num_requests: int
    # Every generated token was asked for: EOS or the request's own max_tokens ends it.
    generated_tokens: list[int]  # per request, in workload order
    useful_tokens: int
    wall_s: float
    useful_tokens_per_s: float
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    peak_num_running: int
    num_preemptions: int
    num_steps: int


def _ttft_s(out: RequestOutput) -> float:
    m = out.metrics
    assert m is not None and m.first_token_time is not None  # the engine's, finished: it has both
    return m.first_token_time - m.arrival_time


@dataclass
class DecodeTiming:
    """Per-step wall times of batch-1 decode, and the context each step attended over."""

    step_s: list[float]
    mean_context_tokens: float

    @property
    def tokens_per_s(self) -> float:
        # The median step: another tenant's burst on a shared CPU inflates a few steps, not it.
        return 1.0 / float(np.median(self.step_s))

    @property
    def mean_tokens_per_s(self) -> float:
        return len(self.step_s) / sum(self.step_s)


def run_engine_workload(
    llm: LLM, prompts: list[list[int]], max_tokens: list[int]
) -> EngineWorkloadResult:
    """Submit every request at once (continuous batching), greedy, EOS allowed; wait for all."""
    params = [SamplingParams(max_tokens=m, temperature=0.0) for m in max_tokens]
    before = llm.stats()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    wall = time.perf_counter() - start
    after = llm.stats()
    generated = [len(o.outputs[0].token_ids) for o in outputs]
    ttft = np.array([_ttft_s(o) for o in outputs])
    return EngineWorkloadResult(
        num_requests=len(prompts),
        generated_tokens=generated,
        useful_tokens=sum(generated),
        wall_s=wall,
        useful_tokens_per_s=sum(generated) / wall,
        ttft_mean_s=float(ttft.mean()),
        ttft_p50_s=float(np.percentile(ttft, 50)),
        ttft_p90_s=float(np.percentile(ttft, 90)),
        peak_num_running=after["peak_num_running"],
        num_preemptions=after["num_preemptions"] - before["num_preemptions"],
        num_steps=after["num_steps"] - before["num_steps"],
    )


def measure_engine_decode(llm: LLM, prompt: list[int], steps: int) -> DecodeTiming:
    """Prefill one request untimed, then time `steps` single-token decode steps."""
    engine = llm.engine
    request_id = "bench-decode"
    params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
    engine.add_request(request_id, prompt, params)
    try:
        # A long prompt may be prefilled in chunks; decode starts once the first token exists.
        while not any(o.outputs[0].token_ids for o in engine.step()):
            pass
        step_s = []
        for _ in range(steps):
            start = time.perf_counter()
            engine.step()
            step_s.append(time.perf_counter() - start)
    finally:
        engine.abort_request(request_id)  # a no-op once finished; frees blocks on error
    # Decode step i (1-based) attends over the prompt plus i tokens.
    return DecodeTiming(step_s, len(prompt) + (steps + 1) / 2)
