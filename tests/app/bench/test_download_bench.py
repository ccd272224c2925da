"""`kvscope bench --download` runs end to end (on a small file: the 200 MiB one is the bench's)."""

import json
from pathlib import Path

from kvscope.app.bench.download_bench import run_download_bench, summarize_download


def test_the_download_bench_times_pull_against_a_plain_read(tmp_path: Path) -> None:
    report = run_download_bench(tmp_path, size_mib=4, rounds=1)
    assert json.loads((tmp_path / "bench_download.json").read_text()) == report
    assert report["bytes"] == 4 << 20
    assert set(report["seconds"]) == {"read_only", "plain_read", "hub_client_read", "pull"}
    assert all(len(seconds) == 1 and seconds[0] > 0 for seconds in report["seconds"].values())
    assert (
        report["pull_over_plain_read"]
        == report["seconds"]["plain_read"][0] / (report["seconds"]["pull"][0])
    )
    assert "kvscope pull" in summarize_download(report)
