"""`kvscope whatif TRACE --set block_size=8,16,32 --set kv_pool=256MiB,1GiB [--json out.json]`.

Replays a recording's traffic (a session file from `kvscope record` or the app's Record button)
under every combination of the settings given, through the engine's own scheduler and
allocator, and prints one row per combination beside the recorded run's own figures; --json
writes the same rows, the cost model and the trace's notes for scripts.

What sizes the work is checked before any of it: the grid's size, and each setting's pool
against this machine's memory (exit 2, in words). Each simulation runs under a step and time
budget (a point past it is a row saying how far it got); past a few seconds each finished
point is reported on stderr, and Ctrl-C stops the run with a line, not a traceback.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

PARALLEL_STEPS = 10_000  # simulated steps (~0.3 ms each) past which a sweep uses processes
PROGRESS_AFTER_S = 2.0  # a run this long reports each simulation as it ends
COLUMNS = (
    ("blocks", 7, "{:>7,}"),
    ("preempt", 7, "{:>7,}"),
    ("peak run", 8, "{:>8,}"),
    ("peak blk", 8, "{:>8,}"),
    ("waited", 6, "{:>6,}"),
    ("refused", 7, "{:>7,}"),
    ("wait s", 7, "{:>7.2f}"),
    ("p95 ttft", 8, "{:>8.2f}"),
    ("span s", 8, "{:>8.1f}"),
    ("diverges", 8, "{:>8}"),
)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "whatif", help="replay a recording's traffic under other settings (no model loaded)"
    )
    p.add_argument("trace", help="session file written by `kvscope record` or the app")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="a setting and its values (every combination runs): kv_pool (256MiB), num_blocks, "
        "block_size, kv_dtype (auto/fp8/float16/bfloat16/float32), max_num_seqs, max_model_len, "
        "max_batched_tokens, prefix_caching (on/off), allocator (paged/contiguous), "
        "honour_windows (on/off), rate_scale (0.5, 2, ...)",
    )
    p.add_argument("--json", default=None, metavar="PATH", help="also write the rows as JSON")
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="processes to simulate in (default: the physical cores; 1: this process only)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="stop a simulation that runs longer than this (default 300); its row says so",
    )


def combinations(sets: list[str]) -> list[dict[str, str]]:
    """`["block_size=8,16", "kv_pool=1GiB"]` -> every combination, as name -> value text."""
    from kvscope.engine.whatif import check_sweep_size

    if not sets:
        return []
    axes = []
    for item in sets:
        name, sep, values = item.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise ValueError(f"--set takes NAME=V1,V2,..., got {item!r}")
        axes.append([(name.strip(), v) for v in values.split(",") if v.strip()])
    check_sweep_size([len(axis) for axis in axes])
    return [dict(combo) for combo in itertools.product(*axes)]


def run(args: argparse.Namespace) -> int:
    done: list[int] = [0]  # simulations finished, for the line Ctrl-C leaves
    try:
        return _run(args, done)
    except KeyboardInterrupt:
        print(f"\ninterrupted after {done[0]} simulations", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace, done: list[int]) -> int:
    from kvscope.engine.cpu_threads import physical_cores
    from kvscope.engine.trace import read_trace
    from kvscope.engine.whatif import (
        CostModel,
        SimBudget,
        SweepWorkerDied,
        WhatIf,
        cost_caveat,
        recorded_summary,
        resolve,
        sweep,
    )

    if not 0 < args.time_limit < float("inf"):
        print(
            f"error: --time-limit must be a number of seconds > 0, got {args.time_limit}",
            file=sys.stderr,
        )
        return 2
    try:
        trace = read_trace(Path(args.trace))
        points = [WhatIf.from_text(c) for c in combinations(args.set)]
        largest = max(_num_blocks(trace, what) for what in [WhatIf(), *points])
    except (ValueError, FileNotFoundError) as e:  # SimulationTooLarge: a pool past the memory
        print(f"error: {e}", file=sys.stderr)
        return 2
    cost = CostModel.fit(trace.steps)
    s = trace.settings
    print(
        f"{len(trace.finished_requests):,} requests over {len(trace.steps):,} steps, recorded "
        f"with {s.num_blocks:,} blocks of {s.block_size} ({s.kv_dtype}), max_num_seqs "
        f"{s.max_num_seqs}, max_model_len {s.max_model_len:,}, {s.allocator}"
    )
    print(f"cost model: {cost.describe()}")
    for note in _notes(trace):
        print(f"note: {note}")
    if args.jobs is not None and args.jobs < 1:
        print(f"error: --jobs must be >= 1, got {args.jobs}", file=sys.stderr)
        return 2
    # (settings, blocks, summary or None where they cannot run, why not)
    rows: list[tuple[str, int, dict[str, Any] | None, str]] = [
        ("recorded run", s.num_blocks, recorded_summary(trace).to_dict(), "")
    ]
    started = time.perf_counter()
    # A process costs ~2 s to start (torch's import): worth it past ~3 s of simulation.
    work = (len(points) + 1) * len(trace.steps)
    jobs = args.jobs or (physical_cores() if work > PARALLEL_STEPS else 1)
    jobs = _jobs_that_fit(jobs, largest)
    budget = SimBudget.for_trace(trace, args.time_limit)
    total = len(points) + 1

    def progress(point) -> None:
        done[0] += 1
        elapsed = time.perf_counter() - started
        if elapsed > PROGRESS_AFTER_S:
            how = "done" if point.summary else f"cannot run: {point.error}"
            print(
                f"[{done[0]}/{total}, {elapsed:.0f} s] {point.what.describe()}: {how}",
                file=sys.stderr,
                flush=True,
            )

    try:
        points_run = sweep(
            trace, [WhatIf(), *points], cost, workers=jobs, budget=budget, on_point=progress
        )
    except SweepWorkerDied as e:  # killed twice (out of memory?): say which point, not hang
        print(f"error: {e}", file=sys.stderr)
        return 1
    caveats = {}  # what -> what its step times cannot know (the same for every row of a dtype)
    for point in points_run:
        summary = point.summary.to_dict() if point.summary else None
        what = point.what.describe()
        rows.append((what, point.num_blocks, summary, point.error))
        if point.summary and (caveat := cost_caveat(s, resolve(s, point.what))):
            caveats[what] = caveat
    elapsed = time.perf_counter() - started
    _print_table(rows)
    for caveat in dict.fromkeys(caveats.values()):
        names = "; ".join(w for w, c in caveats.items() if c == caveat)
        print(f"note ({names}): {caveat}")
    where = f"{jobs} processes" if jobs > 1 else "one process"
    print(f"{len(rows) - 1} simulations in {elapsed:.2f} s ({where})")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "trace": str(args.trace),
                    "settings": s.to_json(),
                    "cost_model": {"describe": cost.describe(), **cost.__dict__},
                    "notes": _notes(trace),
                    "rows": [
                        {
                            "what": w,
                            "num_blocks": b,
                            "summary": summary,
                            "error": error,
                            "caveat": caveats.get(w, ""),
                        }
                        for w, b, summary, error in rows
                    ],
                    "seconds": elapsed,
                },
                indent=1,
            )
        )
        print(f"wrote {args.json}")
    return 0


def _num_blocks(trace, what) -> int:
    """The pool `what` simulates (SimulationTooLarge past this machine's memory); 0 where its
    settings cannot run, which its row will say."""
    from kvscope.engine.whatif import SimulationTooLarge, resolve

    try:
        return resolve(trace.settings, what).num_blocks
    except SimulationTooLarge:
        raise
    except ValueError:
        return 0


def _jobs_that_fit(jobs: int, largest_pool: int) -> int:
    """As many processes as can each hold the largest pool at once (one always can: checked)."""
    from kvscope.engine.whatif import simulated_pool_limit

    while jobs > 1 and largest_pool > simulated_pool_limit(jobs)[0]:
        jobs -= 1
    return jobs


def _notes(trace) -> list[str]:
    notes = list(trace.notes)
    if trace.trimmed:
        notes.append("older traffic was dropped: the pool was not empty where the trace starts")
    if unfinished := len(trace.requests) - len(trace.finished_requests):
        notes.append(f"{unfinished} requests had not finished and are left out")
    return notes


def _print_table(rows) -> None:
    width = max(len(r[0]) for r in rows)
    print(f"{'settings':<{width}}  " + "  ".join(f"{name:>{w}}" for name, w, _ in COLUMNS))
    for what, blocks, summary, error in rows:
        if summary is None:
            print(f"{what:<{width}}  cannot run: {error}")
            continue
        diverges = summary["diverged_at"]
        values = (
            blocks,
            summary["preemptions"],
            summary["peak_running"],
            summary["peak_blocks_used"],
            summary["waited"],
            summary["rejected"],
            summary["mean_wait_s"],
            summary["p95_ttft_s"],
            summary["makespan_s"],
            "-" if diverges is None else f"step {diverges}",
        )
        cells = [fmt.format(v) for (_, _, fmt), v in zip(COLUMNS, values, strict=True)]
        print(f"{what:<{width}}  " + "  ".join(cells))
