"""`kvscope bench --threads`: batch-1 decode at several thread counts, on a quiet and a busy CPU.

A desktop is rarely idle, so the figure that matters is what one busy core does to a decode: the
bench starts a CPU hog (a second Python process spinning, as a busy browser tab would) and
measures every thread count with and without it, alternating, in one run.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from kvscope.app.bench.engine_bench import measure_engine_decode
from kvscope.app.bench.machine import machine_info
from kvscope.engine import LLM
from kvscope.engine.cpu_threads import apply_num_threads, default_num_threads, usable_cpus

HOG = "while True: pass"


@dataclass
class ThreadCase:
    threads: int
    busy_core: bool
    tokens_per_s: list[float]  # one figure per round

    @property
    def median(self) -> float:
        return statistics.median(self.tokens_per_s)


class CpuHog:
    """One process spinning on a core until the block ends."""

    def __enter__(self) -> CpuHog:
        self.proc = subprocess.Popen([sys.executable, "-c", HOG])
        time.sleep(0.2)  # let it reach the scheduler before timing starts
        return self

    def __exit__(self, *exc) -> None:
        self.proc.kill()
        self.proc.wait()


def decode_tokens_per_s(llm: LLM, prompt: list[int], steps: int) -> float:
    """Median tokens/s of `steps` batch-1 decode steps after an untimed prefill."""
    return measure_engine_decode(llm, prompt, steps).tokens_per_s


def thread_counts(default: int, cpus: int) -> list[int]:
    """1, every count up to the usable CPUs (at most 4 of them), and the default."""
    return sorted({1, default, *range(2, min(cpus, 4) + 1)})


def run_threads_bench(out: Path, steps: int = 32, rounds: int = 3) -> dict:
    from kvscope.app.bench.workload import load_chat_workload

    default = default_num_threads()
    counts = thread_counts(default, len(usable_cpus()))
    llm = LLM(max_model_len=2048, num_threads=default)
    engine = llm.engine
    request = load_chat_workload(None, 1, None)[0]
    prompt = engine.tokenize(engine.apply_chat_template(request.messages))[1]
    decode_tokens_per_s(llm, prompt, 4)  # warm-up
    cases = {(n, busy): ThreadCase(n, busy, []) for busy in (False, True) for n in counts}
    for _ in range(rounds):
        for busy in (False, True):
            with CpuHog() if busy else contextlib.nullcontext():
                for n in counts:
                    engine.num_threads = apply_num_threads(n)
                    cases[(n, busy)].tokens_per_s.append(decode_tokens_per_s(llm, prompt, steps))
    engine.num_threads = apply_num_threads(default)
    rows = [
        {
            "threads": n,
            "default": n == default,
            "quiet_tokens_per_s": cases[(n, False)].median,
            "busy_core_tokens_per_s": cases[(n, True)].median,
            "busy_over_quiet": cases[(n, True)].median / cases[(n, False)].median,
            "rounds_quiet": cases[(n, False)].tokens_per_s,
            "rounds_busy_core": cases[(n, True)].tokens_per_s,
        }
        for n in counts
    ]
    report = {
        "machine": machine_info(),
        "model": engine.model_source,
        "weights": engine.stats()["weight_format"],
        "dtype": engine.stats()["dtype"],
        "steps": steps,
        "rounds": rounds,
        "default_threads": default,
        "rows": rows,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_threads.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_threads(report, out / "bench_threads.png")
    return report


def summarize_threads(report: dict) -> str:
    lines = [f"batch-1 decode, tokens/s (median of {report['rounds']} rounds)"]
    lines.append("  threads   quiet   one core busy   busy/quiet")
    for row in report["rows"]:
        mark = " (default)" if row["default"] else ""
        lines.append(
            f"  {row['threads']:>7}  {row['quiet_tokens_per_s']:6.1f}  "
            f"{row['busy_core_tokens_per_s']:14.1f}   {row['busy_over_quiet']:9.2f}{mark}"
        )
    return "\n".join(lines)


def plot_threads(report: dict, path: Path) -> None:
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    rows = report["rows"]
    labels = [f"{r['threads']}{'*' if r['default'] else ''}" for r in rows]
    x = range(len(rows))
    width = 0.38
    quiet = ax.bar([i - width / 2 for i in x], [r["quiet_tokens_per_s"] for r in rows], width)
    busy = ax.bar([i + width / 2 for i in x], [r["busy_core_tokens_per_s"] for r in rows], width)
    for bars in (quiet, busy):
        ax.bar_label(bars, labels=[f"{b.get_height():.1f}" for b in bars], padding=2)
    ax.set_xticks(list(x), labels)
    ax.set_xlabel("torch threads (* the default)")
    ax.set_ylabel("tokens / s")
    ax.set_title("batch-1 decode: quiet CPU vs one core busy")
    ax.legend([quiet, busy], ["quiet", "one core busy"])
    ax.margins(y=0.15)
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=100)
