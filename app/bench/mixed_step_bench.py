"""`kvscope bench --mixed`: what a prompt chunk costs beside running decodes, and what it does to
their inter-token time.

Three figures on one engine, alternated round by round so a busy machine weighs on each alike:

- a prompt of `prompt_tokens` prefilled alone (one step, no decodes), ms per prompt token;
- the same prompt beside `decodes` running decodes (one mixed step), its cost above a decode-only
  step per prompt token, and that decode-only step;
- the decodes' inter-token time while a `long_prompt_tokens` prompt prefills beside them, with
  the engine's cap on prompt tokens beside decodes (EngineConfig.prefill_tokens_beside_decodes)
  and without it, and how long that prompt took to prefill either way.

Prompts are fresh random token ids (an unseeded generator: a second run on the same engine must
not hit the first one's blocks), so no prefix-cache hit makes a prefill look cheaper than it is.
"""

from __future__ import annotations

import json
import platform
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvscope.app.bench.machine import machine_info
from kvscope.engine import LLM, SamplingParams


@dataclass
class MixedReport:
    prompt_tokens: int
    decodes: int
    long_prompt_tokens: int
    cap: int | None  # the engine's prompt tokens beside decodes
    prefill_alone_ms: list[float] = field(default_factory=list)
    mixed_ms: list[float] = field(default_factory=list)
    decode_only_ms: list[float] = field(default_factory=list)
    # Per round: the decodes' step times while the long prompt prefilled beside them.
    inter_token_capped_ms: list[list[float]] = field(default_factory=list)
    inter_token_uncapped_ms: list[list[float]] = field(default_factory=list)
    long_prefill_capped_ms: list[float] = field(default_factory=list)
    long_prefill_uncapped_ms: list[float] = field(default_factory=list)
    machine: dict = field(default_factory=dict)

    def summary(self) -> dict:
        med = statistics.median
        alone, mixed, dec = med(self.prefill_alone_ms), med(self.mixed_ms), med(self.decode_only_ms)
        alone_tok = alone / self.prompt_tokens
        mixed_tok = (mixed - dec) / self.prompt_tokens
        out: dict = {
            "prefill_alone_ms_per_token": round(alone_tok, 3),
            "mixed_ms_per_prompt_token": round(mixed_tok, 3),
            "mixed_over_alone": round(mixed_tok / alone_tok, 2),
            "decode_only_step_ms": round(dec, 1),
        }
        for name in ("capped", "uncapped"):
            gaps = [g for run in getattr(self, f"inter_token_{name}_ms") for g in run]
            if gaps:
                out[f"inter_token_{name}_ms"] = {
                    "median": round(med(gaps), 1),
                    "max": round(max(gaps), 1),
                }
                out[f"long_prefill_{name}_ms"] = round(
                    med(getattr(self, f"long_prefill_{name}_ms")), 1
                )
        return out


class _Driver:
    """Requests of random prompts on one engine, stepped by hand."""

    def __init__(self, llm: LLM, seed: int | None = None) -> None:
        self.engine = llm.engine
        self.rng = random.Random(seed)
        self.vocab = self.engine.model_config.vocab_size
        self.count = 0

    def add(self, tokens: int, max_tokens: int) -> str:
        self.count += 1
        rid = f"mixed-{self.count}"
        ids = [self.rng.randrange(self.vocab) for _ in range(tokens)]
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        self.engine.add_request(rid, "", params, prompt_token_ids=ids)
        return rid

    def step_ms(self) -> float:
        started = time.perf_counter()
        self.engine.step()
        return (time.perf_counter() - started) * 1000

    def abort_all(self) -> None:
        for rid in list(self.engine.requests):
            self.engine.abort_request(rid)

    def prefilling(self, rid: str) -> bool:
        request = self.engine.requests.get(rid)
        return request is not None and not request.sequences[0].output_token_ids


def run_mixed(
    llm: LLM,
    prompt_tokens: int = 256,
    decodes: int = 8,
    long_prompt_tokens: int = 1024,
    rounds: int = 5,
    decode_steps: int = 5,
) -> MixedReport:
    """The figures of the module doc on `llm` (left with no requests)."""
    d = _Driver(llm)
    sched = d.engine.scheduler
    cap = sched.prefill_beside_decodes
    report = MixedReport(prompt_tokens, decodes, long_prompt_tokens, cap, machine=machine_info())
    d.add(prompt_tokens, 2)  # warm-up: first shapes, compiles
    while d.engine.has_unfinished_requests():
        d.engine.step()
    try:
        for _ in range(rounds):
            d.add(prompt_tokens, 1)
            report.prefill_alone_ms.append(d.step_ms())
            d.abort_all()
            for _ in range(decodes):
                d.add(8, 1 << 20)
            while any(d.prefilling(r) for r in d.engine.requests):
                d.engine.step()
            times = [d.step_ms() for _ in range(decode_steps)]
            report.decode_only_ms.append(statistics.median(times))
            d.add(prompt_tokens, 1)
            report.mixed_ms.append(d.step_ms())
            for capped in (True, False):
                sched.prefill_beside_decodes = cap if capped else None
                rid = d.add(long_prompt_tokens, 1)
                gaps = []
                while d.prefilling(rid):
                    gaps.append(d.step_ms())
                name = "capped" if capped else "uncapped"
                getattr(report, f"inter_token_{name}_ms").append(gaps)
                getattr(report, f"long_prefill_{name}_ms").append(sum(gaps))
            d.abort_all()
    finally:
        sched.prefill_beside_decodes = cap
        d.abort_all()
    return report


def run_mixed_bench(out: Path, **kwargs: int) -> dict:
    """The bench on a default engine (the bundled model), written to out/bench_mixed.json."""
    report = run_mixed(LLM(), **kwargs)
    result = {"summary": report.summary(), "cpu": cpu_name(), **asdict(report)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_mixed.json").write_text(json.dumps(result, indent=2))
    return result


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (Linux), else what the platform says."""
    try:
        for line in cpuinfo.read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"


def summarize_mixed(result: dict) -> str:
    s, cpu = result["summary"], result["cpu"]
    lines = [
        f"mixed steps ({cpu}, {result['machine']['torch_threads']} threads): a "
        f"{result['prompt_tokens']}-token prompt alone {s['prefill_alone_ms_per_token']} ms a "
        f"token, beside {result['decodes']} decodes {s['mixed_ms_per_prompt_token']} "
        f"(x{s['mixed_over_alone']}); decode-only step {s['decode_only_step_ms']} ms"
    ]
    for name in ("capped", "uncapped"):
        if f"inter_token_{name}_ms" in s:
            gap = s[f"inter_token_{name}_ms"]
            lines.append(
                f"  decodes beside a {result['long_prompt_tokens']}-token prefill, {name}: "
                f"inter-token median {gap['median']} ms, max {gap['max']} ms; the prompt took "
                f"{s[f'long_prefill_{name}_ms']} ms"
            )
    return "\n".join(lines)
