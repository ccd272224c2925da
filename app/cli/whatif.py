"""`kvscope whatif TRACE --set block_size=8,16,32 --set kv_pool=256MiB,1GiB [--json out.json]`.

Replays a recording's traffic (a session file from `kvscope record` or the app's Record button)
under every combination of the settings given, through the engine's own scheduler and
allocator, and prints one row per combination beside the recorded run's own figures; --json
writes the same rows, the cost model and the trace's notes for scripts.
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


def combinations(sets: list[str]) -> list[dict[str, str]]:
    """`["block_size=8,16", "kv_pool=1GiB"]` -> every combination, as name -> value text."""
    axes = []
    for item in sets:
        name, sep, values = item.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise ValueError(f"--set takes NAME=V1,V2,..., got {item!r}")
        axes.append([(name.strip(), v) for v in values.split(",") if v.strip()])
    return [dict(combo) for combo in itertools.product(*axes)]


def run(args: argparse.Namespace) -> int:
    from kvscope.engine.cpu_threads import physical_cores
    from kvscope.engine.trace import read_trace
    from kvscope.engine.whatif import (
        CostModel,
        WhatIf,
        cost_caveat,
        recorded_summary,
        resolve,
        sweep,
    )

    try:
        trace = read_trace(Path(args.trace))
        points = [WhatIf.from_text(c) for c in combinations(args.set)]
    except (ValueError, FileNotFoundError) as e:
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
    caveats = {}  # what -> what its step times cannot know (the same for every row of a dtype)
    for point in sweep(trace, [WhatIf(), *points], cost, workers=jobs):
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
