"""The map redraw benchmark runs the real view on its pools and reports every figure (the
figures themselves are the benchmark's to judge, not a test's)."""

from __future__ import annotations

from kvscope.app.desktop.blockmap.redraw_bench import busy_pool, run_map_redraw_bench
from kvscope.engine.kv.snapshot import BlockState


def test_the_busy_pool_holds_or_caches_every_block():
    pool = busy_pool(5_000)
    held = (pool.state == BlockState.USED) | (pool.state == BlockState.CACHED)
    assert held.all() and (pool.ref_count > 1).any() and pool.metrics.blocks_used > 3_000


def test_the_benchmark_reports_each_pool_and_view(qapp):
    report = run_map_redraw_bench(pool_sizes=(64, 20_000), view_sizes=((400, 300),), repeats=2)
    runs = report["runs"]
    assert [(r["blocks"], r["pool"]) for r in runs] == [
        (64, "realistic"),
        (64, "busy"),
        (20_000, "realistic"),
        (20_000, "busy"),
    ]
    assert runs[0]["mode"] == "one cell per block" and runs[-1]["mode"] == "overview + lens"
    assert runs[-1]["blocks_per_dot"] > 1
    assert all(r["median_ms"] > 0 and r["p90_ms"] >= r["median_ms"] for r in runs)
    assert report["frame_budget_ms"] == 16.0 and report["cpu"]
    assert report["worst_median_ms"] == max(r["median_ms"] for r in runs)
