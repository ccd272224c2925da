"""`kvscope bench --whatif` end to end on a small workload: each pair of real runs, the
simulation of the first, the report's figures against the traces, and its JSON and PNG."""

from __future__ import annotations

import json

from PIL import Image

from kvscope.app.bench import whatif_bench
from kvscope.engine.whatif import recorded_summary


def test_the_whatif_bench_compares_real_runs_with_their_simulation(tmp_path, monkeypatch):
    pool = whatif_bench.POOL
    monkeypatch.setattr(
        whatif_bench,
        "cases",
        lambda _pool: [
            ("as recorded", {}, {}),
            ("a quarter of the pool", {"kv_cache_memory": pool // 4}, {"kv_pool": pool // 4}),
        ],
    )
    report = whatif_bench.run_whatif_bench(tmp_path, num_requests=3, mean_gap_s=0.05)
    saved = json.loads((tmp_path / "bench_whatif.json").read_text())
    assert saved["rows"] == report["rows"] and len(report["rows"]) == 2
    same, quarter = report["rows"]
    assert quarter["num_blocks"] == 16 and same["num_blocks"] == 64
    # The "as recorded" replay is the recording itself: it never leaves it.
    assert same["diverged_at"] is None
    for row in report["rows"]:
        assert set(row["duration_error"]) == set(whatif_bench.DURATIONS)
        assert len(row["sim_blocks_used"]) == row["simulated"]["steps"]
        assert len(row["real_blocks_used"]) == row["real"]["steps"]
    assert report["sweep"]["points"] == 20
    assert Image.open(tmp_path / "bench_whatif.png").size[0] > 800
    assert "sweep of 20 pool sizes" in whatif_bench.summarize_whatif(report)


def test_the_drive_adds_requests_as_they_arrive_in_wall_time():
    from kvscope.engine.model.loader import load_model

    work = whatif_bench.schedule(3, 0.2, 4)
    assert [at for at, _, _ in work][0] == 0.0 and work[2][0] > work[1][0] > 0
    trace = whatif_bench.drive(load_model(None), {}, work)
    assert len(trace.finished_requests) == 3
    arrivals = [r.time - trace.requests[0].time for r in trace.requests]
    assert all(real >= planned - 0.01 for real, (planned, _, _) in zip(arrivals, work, strict=True))
    assert recorded_summary(trace).requests == 3
