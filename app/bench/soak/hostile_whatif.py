"""The soak's what-if leg: hostile traces fed to the what-if simulator the way `kvscope whatif`
reads and runs them (the trace reader, the knobs' bounds, the simulation's budget), each of which
must end in a clear refusal, quickly and without the memory a bomb asks for.

The cases (issue 43): a NaN arrival time with rate_scale != 1 (once spun a core forever), a
header declaring 10^8 blocks and a knob asking for as many (once built a 5.5 GB pool), a
1M-token prompt with max_batched_tokens=1 (once ran past a minute, memory rising) and an
infinite step duration (once an uncaught ValueError). Each row: refused or not, the message, the
seconds it took and the peak RSS rise over this process's RSS when it began (sampled every few
ms). The traces are synthetic: a tiny two-request session written here, no model needed."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kvscope.app.bench.soak.watch import rss_mb

# The simulation's time budget here (`kvscope whatif --time-limit`): its step budget is the
# command's own, and it runs out first on the slow cases, so the leg takes a few seconds.
TIME_LIMIT_S = 1.0
SAMPLE_EVERY_S = 0.005
BLOCK_SIZE = 16
HUGE_PROMPT = 1_000_000


def _settings(num_blocks: int = 64, max_model_len: int = 1024) -> dict:
    return {
        "model": "soak-synthetic",
        "num_layers": 2,
        "num_kv_heads": 2,
        "head_dim": 16,
        "layer_windows": [None, None],
        "kv_dtype": "float32",
        "num_blocks": num_blocks,
        "block_size": BLOCK_SIZE,
        "max_num_seqs": 4,
        "max_batched_tokens": 256,
        "max_model_len": max_model_len,
        "enable_prefix_caching": True,
        "allocator": "paged",
        "release_window_blocks": False,
        "model_context": max_model_len,
        "device": "cpu",
    }


def write_trace(
    path: Path,
    *,
    arrival: float = 1.0,
    duration: float = 0.01,
    prompt_tokens: int = 32,
    num_blocks: int = 64,
) -> Path:
    """A two-request session with a traffic trace (format version 4): the first request's
    arrival time, the first step's duration, its prompt's length and the header's pool as
    given. NaN and Infinity are written as Python's json writes them (and reads them)."""
    max_len = max(1024, prompt_tokens + 64)
    blocks = max(num_blocks, 0)
    header = {
        "kvscope_events": 4,
        "num_blocks": min(blocks, 1 << 24),
        "block_size": BLOCK_SIZE,
        "trace": _settings(blocks, max_len),
        "trace_start_step": 0,
    }
    lines = [json.dumps(header)]
    prompts = {"r0": prompt_tokens, "r1": 32}
    for i, (rid, n) in enumerate(prompts.items()):
        request = {
            "kind": "trace_request",
            "step": 0,
            "time": arrival if i == 0 else 1.0,
            "request_id": rid,
            "prompt_token_ids": [2 + j % 400 for j in range(n)],
            "n": 1,
            "max_tokens": 8,
        }
        lines.append(json.dumps(request))
    for step in range(1, 11):
        lines.append(
            json.dumps(
                {
                    "kind": "trace_step",
                    "step": step,
                    "time": 1.0 + step * 0.01,
                    "duration": duration if step == 1 else 0.01,
                    "prefill_tokens": 64 if step == 1 else 0,
                    "prefill_seqs": 2 if step == 1 else 0,
                    "decode_seqs": 0 if step == 1 else 2,
                    "context_tokens": 64 + 2 * step,
                    "blocks_used": 6,
                    "blocks_cached": 0,
                    "running": 2,
                    "waiting": 0,
                    "preemptions": 0,
                    "prefix_hit_tokens": 0,
                }
            )
        )
    for rid in prompts:
        finish = {
            "kind": "trace_finish",
            "step": 10,
            "time": 1.11,
            "request_id": rid,
            "outputs": [[5] * 8],
            "reasons": ["length"],
            "first_scheduled_step": 1,
            "first_token_step": 1,
        }
        lines.append(json.dumps(finish))
    path.write_text("\n".join(lines) + "\n")
    return path


def run_like_the_command(path: Path, knobs: dict[str, str]) -> str:
    """What `kvscope whatif PATH --set K=V ... --jobs 1 --time-limit TIME_LIMIT_S` does up to
    its table; the refusal's message, or "" where every point ran."""
    from kvscope.engine.trace import read_trace
    from kvscope.engine.whatif import CostModel, SimBudget, WhatIf, resolve, sweep

    try:
        trace = read_trace(path)
        point = WhatIf.from_text(knobs)
        resolve(trace.settings, point)  # SimulationTooLarge: a pool past this machine's memory
    except ValueError as e:
        return str(e)
    budget = SimBudget.for_trace(trace, TIME_LIMIT_S)
    [result] = sweep(trace, [point], CostModel.fit(trace.steps), workers=1, budget=budget)
    return "" if result.summary is not None else result.error or "no summary, no reason"


class _PeakRss:
    """This process's highest RSS while it is open, sampled on a thread."""

    def __init__(self) -> None:
        self.start = rss_mb() or 0.0
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            self.peak = max(self.peak, rss_mb() or 0.0)

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb() or 0.0)


def hostile_cases(folder: Path) -> list[tuple[str, Callable[[], str]]]:
    folder.mkdir(parents=True, exist_ok=True)
    nan = write_trace(folder / "nan_arrival.jsonl", arrival=math.nan)
    bomb = write_trace(folder / "num_blocks_1e8.jsonl", num_blocks=10**8)
    plain = write_trace(folder / "plain.jsonl")
    huge = write_trace(
        folder / "prompt_1m.jsonl",
        prompt_tokens=HUGE_PROMPT,
        num_blocks=HUGE_PROMPT // BLOCK_SIZE + 64,
    )
    endless = write_trace(folder / "infinite_duration.jsonl", duration=math.inf)
    return [
        ("NaN arrival, rate_scale=2", lambda: run_like_the_command(nan, {"rate_scale": "2"})),
        ("header num_blocks 10^8", lambda: run_like_the_command(bomb, {})),
        (
            "--set num_blocks=100000000",
            lambda: run_like_the_command(plain, {"num_blocks": "100000000"}),
        ),
        (
            "1M-token prompt, max_batched_tokens=1",
            lambda: run_like_the_command(huge, {"max_batched_tokens": "1"}),
        ),
        ("infinite step duration", lambda: run_like_the_command(endless, {})),
    ]


def run_hostile_whatif(folder: Path) -> list[dict]:
    """Each case's row: {"case", "refused", "message", "seconds", "peak_rss_delta_mb"}."""
    rows = []
    for name, case in hostile_cases(folder):
        started = time.perf_counter()
        with _PeakRss() as rss:
            try:
                message, clean = case(), True
            except Exception as e:  # noqa: BLE001  reported as not refused, with its type
                message, clean = f"not a clean refusal: {type(e).__name__}: {e}", False
        rows.append(
            {
                "case": name,
                "refused": clean and bool(message),
                "message": message[:400],
                "seconds": round(time.perf_counter() - started, 3),
                "peak_rss_delta_mb": round(rss.peak - rss.start, 1),
            }
        )
    return rows
