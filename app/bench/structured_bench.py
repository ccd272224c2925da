"""Structured outputs under load: 16 concurrent requests, half constrained by a JSON Schema,
against the same 16 unconstrained, run alternately on one engine; and what a grammar costs to
compile and to mask a token with.

Every request runs exactly `max_tokens` steps (the schema's shortest valid reply is longer), so
the two runs do the same work but for the masks: the ratio is the grammar's cost, not a
difference in how much was generated."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from kvscope.engine import LLM, SamplingParams, StructuredOutputsParams

NUM_REQUESTS = 16
THROUGHPUT_TARGET = 0.85  # mixed output tok/s over all-unconstrained
# An unconstrained request's decode rate beside constrained ones over its rate without them:
# no slower.
FREE_REQUESTS_TARGET = 1.0
# Eight sentences of 40-80 characters: no valid reply is shorter than ~100 tokens.
LONG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 20, "maxLength": 60},
        "notes": {
            "type": "array",
            "items": {"type": "string", "minLength": 40, "maxLength": 80},
            "minItems": 8,
            "maxItems": 8,
        },
    },
    "required": ["title", "notes"],
}
# Schemas whose compile time is reported: small, a typical tool, and a wide enum.
COMPILE_SCHEMAS: dict[str, dict[str, Any]] = {
    "small_object": {"type": "object", "properties": {"a": {"type": "integer"}}},
    "long_notes": LONG_SCHEMA,
    "enum_1000": {"enum": [f"option-{i}" for i in range(1000)]},
    "nested_8": {"type": "object", "properties": {"next": {"$ref": "#"}, "v": {"type": "string"}}},
}


@dataclass
class MixRun:
    output_tokens: int
    wall_s: float
    output_tokens_per_s: float
    # Per unconstrained request: its tokens after the first over the time they took.
    free_decode_tokens_per_s: float


def _params(i: int, max_tokens: int, constrained: bool) -> SamplingParams:
    structured = StructuredOutputsParams(json=LONG_SCHEMA) if constrained else None
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=0.8,
        seed=i,
        ignore_eos=True,
        structured_outputs=structured,
    )


def _run(llm: LLM, prompts: list[list[int]], max_tokens: int, constrained: set[int]) -> MixRun:
    params = [_params(i, max_tokens, i in constrained) for i in range(len(prompts))]
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    rates = []
    for i, out in enumerate(outs):
        m = out.metrics
        if i in constrained or m is None or m.first_token_time is None or not m.finished_time:
            continue
        span = m.finished_time - m.first_token_time
        if span > 0:
            rates.append((len(out.outputs[0].token_ids) - 1) / span)
    return MixRun(tokens, wall, tokens / wall, statistics.fmean(rates))


def measure_structured(
    llm: LLM, prompts: list[list[int]], max_tokens: int = 64, rounds: int = 4
) -> dict[str, Any]:
    """All-free and half-constrained runs `rounds` times each, alternating which goes first;
    the median of each."""
    prompts = [prompts[i % len(prompts)] for i in range(NUM_REQUESTS)]
    half = set(range(0, NUM_REQUESTS, 2))
    compile_ms = _compile_ms(llm)
    llm.generate(prompts[:1], _params(0, 4, True))  # warm: the grammar is cached from here
    free, mixed = [], []
    for i in range(rounds):
        # Either kind goes first in turn, so an order effect (a shared machine's load, caches)
        # is not charged to one of them.
        if i % 2:
            mixed.append(_run(llm, prompts, max_tokens, half))
        free.append(_run(llm, prompts, max_tokens, set()))
        if not i % 2:
            mixed.append(_run(llm, prompts, max_tokens, half))
    free_rate = statistics.median(r.output_tokens_per_s for r in free)
    mixed_rate = statistics.median(r.output_tokens_per_s for r in mixed)
    free_alone = statistics.median(r.free_decode_tokens_per_s for r in free)
    free_mixed = statistics.median(r.free_decode_tokens_per_s for r in mixed)
    ratio = mixed_rate / free_rate
    return {
        "num_requests": NUM_REQUESTS,
        "constrained": len(half),
        "max_tokens": max_tokens,
        "unconstrained_runs": [asdict(r) for r in free],
        "mixed_runs": [asdict(r) for r in mixed],
        "output_tokens_per_s": {"unconstrained": free_rate, "half_constrained": mixed_rate},
        "mixed_over_unconstrained": ratio,
        "free_requests_decode_tokens_per_s": {
            "without": free_alone,
            "beside_constrained": free_mixed,
        },
        "free_requests_ratio": free_mixed / free_alone,
        "mask_ms_per_token": _mask_ms(llm),
        "compile_ms": compile_ms,
        "target": {"ratio": ratio, "target": THROUGHPUT_TARGET, "met": ratio >= THROUGHPUT_TARGET},
    }


def _compile_ms(llm: LLM) -> dict[str, float]:
    grammars = llm.engine.grammars
    start = time.perf_counter()
    grammars.tokenizer  # noqa: B018  # the vocabulary, wrapped once per model
    timings = {"tokenizer_once": 1000 * (time.perf_counter() - start)}
    for name, schema in COMPILE_SCHEMAS.items():
        # A variant the cache has not seen: each compile is a first compile.
        fresh = {**schema, "$comment": f"bench-{time.monotonic_ns()}"}
        start = time.perf_counter()
        grammars.compile(StructuredOutputsParams(json=fresh))
        timings[name] = 1000 * (time.perf_counter() - start)
    return timings


def _mask_ms(llm: LLM, tokens: int = 64) -> float:
    """Mean time to fill one constrained sequence's mask, walking a reply of LONG_SCHEMA."""
    engine = llm.engine
    matcher = engine.grammars.compile(StructuredOutputsParams(json=LONG_SCHEMA)).matcher()
    text = '{"title":"A short history of the lighthouse","notes":["The keeper climbs'
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    times = []
    for token in ids[:tokens]:
        start = time.perf_counter()
        engine.step_masks.fill([(0, matcher)])
        times.append(time.perf_counter() - start)
        if not matcher.accept(token):
            break
    return 1000 * statistics.median(times)
