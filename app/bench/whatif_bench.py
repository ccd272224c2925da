"""`kvscope bench --whatif`: the what-if simulator against real engine runs, on this machine.

One workload (chat requests from the bundled workload, greedy, each to a fixed length, arriving
by a seeded Poisson process in wall time) runs on the real engine twice per setting: under the
recorded settings, then at once under the what-if's (a shared machine drifts by several percent
over minutes, so each pair is measured back to back); the simulator replays the first run's
trace under the what-if. The report gives, per setting, the real and simulated allocation
figures (preemptions, peak concurrency, peak blocks, requests that waited, steps) and the
modelled durations' errors against the real run's (makespan, busy time, mean and p95 time to
first token). Its first row ("as recorded") is two real runs of the same settings: the noise
any figure below carries, since arrivals in wall time land on other steps from run to run. Then
how long a sweep of 20 pool sizes over a recorded trace takes. JSON + PNG in --out.
"""

from __future__ import annotations

import json
import random
import time
from collections import deque
from pathlib import Path

from matplotlib.figure import Figure

from kvscope.app.bench.cpu_model import cpu_model_name
from kvscope.app.bench.workload import load_chat_workload

# 64 blocks of the bundled model's bfloat16 KV (368,640 bytes per block of 16): enough for the
# workload's concurrency without preemption; half of it preempts.
POOL = 64 * 368_640
ALLOCATION = ("preemptions", "peak_running", "peak_blocks_used", "waited", "steps")
DURATIONS = ("makespan_s", "busy_s", "mean_ttft_s", "p95_ttft_s")


def cases(pool: int) -> list[tuple[str, dict, dict]]:
    """(label, engine overrides, what-if knobs)."""
    return [
        ("as recorded", {}, {}),
        ("a quarter of the pool", {"kv_cache_memory": pool // 4}, {"kv_pool": pool // 4}),
        ("block size 32", {"block_size": 32}, {"block_size": 32}),
        ("prefix caching off", {"enable_prefix_caching": False}, {"prefix_caching": False}),
        # Same bytes, twice the blocks; the cost model has no dtype term, so this row says
        # what an 8-bit cache's (de)quantization costs the real run.
        ("fp8 KV cache", {"kv_cache_dtype": "fp8"}, {"kv_dtype": "fp8"}),
        ("max_num_seqs 4", {"max_num_seqs": 4}, {"max_num_seqs": 4}),
        ("arrivals x2", {}, {"rate_scale": 2.0}),
    ]


def schedule(num_requests: int, mean_gap_s: float, max_tokens: int, seed: int = 0) -> list:
    """(arrival offset in seconds, chat messages, max_tokens) per request."""
    rng = random.Random(seed)
    at, out = 0.0, []
    for request in load_chat_workload(None, num_requests, max_tokens):
        out.append((at, request.messages, request.max_tokens))
        at += rng.expovariate(1.0 / mean_gap_s)
    return out


def drive(loaded, settings: dict, work: list, rate_scale: float = 1.0):
    """Run `work` on a real engine as its requests arrive in wall time; returns its trace."""
    from kvscope.engine import LLM, SamplingParams

    llm = LLM(model=loaded, **{"kv_cache_memory": POOL, **settings})
    engine = llm.engine
    prompts = [engine.apply_chat_template(messages) for _, messages, _ in work]
    pending = deque(zip(work, prompts, strict=True))
    started = time.time()
    i = 0
    while pending or engine.has_unfinished_requests():
        now = time.time() - started
        while pending and pending[0][0][0] / rate_scale <= now:
            (_, _, max_tokens), prompt = pending.popleft()
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            engine.add_request(f"w{i}", prompt, params)
            i += 1
        if engine.has_unfinished_requests():
            engine.step()
        elif pending:
            time.sleep(max(0.0, pending[0][0][0] / rate_scale - now))
    return engine.trace.trace()


def run_whatif_bench(out: Path, num_requests: int = 40, mean_gap_s: float = 0.5) -> dict:
    from kvscope.engine.model.loader import load_model
    from kvscope.engine.whatif import CostModel, WhatIf, grid, recorded_summary, simulate, sweep

    out.mkdir(parents=True, exist_ok=True)
    loaded = load_model(None)
    work = schedule(num_requests, mean_gap_s, 64)
    rows = []
    for label, settings, knobs in cases(POOL):
        recorded = drive(loaded, {}, work)
        real = drive(loaded, settings, work, knobs.get("rate_scale", 1.0))
        cost = CostModel.fit(recorded.steps)
        sim = simulate(recorded, WhatIf(**knobs), cost)
        mine, theirs = sim.summary.to_dict(), recorded_summary(real).to_dict()
        rows.append(
            {
                "label": label,
                "knobs": knobs,
                "cost_model": cost.describe(),
                "num_blocks": sim.config.num_blocks,
                "diverged_at": sim.summary.diverged_at,
                "real": theirs,
                "simulated": mine,
                "allocation_equal": {k: mine[k] == theirs[k] for k in ALLOCATION},
                "duration_error": {
                    k: (mine[k] - theirs[k]) / theirs[k] if theirs[k] else None for k in DURATIONS
                },
                "real_blocks_used": [s.blocks_used for s in real.steps],
                "sim_blocks_used": [s.blocks_used for s in sim.steps],
                "real_times": [s.time - real.steps[0].time for s in real.steps],
                "sim_times": [s.time for s in sim.steps],
            }
        )
        print(_row_line(rows[-1]))
    pools = [int(POOL * 2 ** (k / 4)) for k in range(-10, 10)]  # 20 pools, x0.18 .. x4.8
    started = time.perf_counter()
    swept = sweep(recorded, grid({"kv_pool": pools}), cost)
    sweep_s = time.perf_counter() - started
    report = {
        "cpu": cpu_model_name(),
        "model": recorded.settings.model,
        "requests": num_requests,
        "mean_gap_s": mean_gap_s,
        "recorded_steps": len(recorded.steps),
        "cost_model": cost.describe(),  # the last pair's; each row has its own
        "rows": rows,
        "sweep": {
            "points": len(swept),
            "seconds": sweep_s,
            "pools": pools,
            "preemptions": [p.summary.preemptions if p.summary else None for p in swept],
        },
    }
    (out / "bench_whatif.json").write_text(json.dumps(report, indent=1))
    plot_whatif(report, out / "bench_whatif.png")
    return report


def _row_line(row: dict) -> str:
    real, sim, err = row["real"], row["simulated"], row["duration_error"]
    same = (
        "all equal"
        if all(row["allocation_equal"].values())
        else "differ: "
        + ", ".join(
            f"{k} {sim[k]} (real {real[k]})" for k, ok in row["allocation_equal"].items() if not ok
        )
    )
    errors = ", ".join(
        f"{k.removesuffix('_s')} {100 * v:+.1f}%" for k, v in err.items() if v is not None
    )
    return f"  {row['label']:<22} allocation {same}; modelled vs real: {errors}"


def summarize_whatif(report: dict) -> str:
    lines = [
        f"what-if against real runs ({report['requests']} requests, {report['cpu']}):",
        f"  cost model: {report['cost_model']}",
        *(_row_line(r) for r in report["rows"]),
        f"  sweep of {report['sweep']['points']} pool sizes over the {report['recorded_steps']}"
        f"-step trace: {report['sweep']['seconds']:.2f} s",
    ]
    return "\n".join(lines)


def plot_whatif(report: dict, path: Path) -> None:
    rows = report["rows"]
    fig = Figure(figsize=(12, 2.6 * ((len(rows) + 2) // 3)), layout="constrained")
    axes = fig.subplots((len(rows) + 2) // 3, 3, squeeze=False).ravel()
    for ax, row in zip(axes, rows, strict=False):
        ax.plot(row["real_times"], row["real_blocks_used"], color="#2a7ab9", label="real run")
        ax.plot(row["sim_times"], row["sim_blocks_used"], ":", color="#d2691e", label="simulated")
        err = row["duration_error"]["makespan_s"]
        ax.set_title(f"{row['label']} (makespan {100 * err:+.1f}%)", fontsize=9)
        ax.set_xlabel("seconds")
        ax.set_ylabel("blocks used")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(rows) :]:
        ax.set_visible(False)
    fig.suptitle(f"What-if simulation vs real engine runs, {report['cpu']}", fontsize=10)
    fig.savefig(path, dpi=110)
