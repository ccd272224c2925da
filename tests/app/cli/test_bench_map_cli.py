"""`kvscope bench --map`: the block map's redraw benchmark from the command line, its JSON written
where --out says (a smaller run than the real one: two pool sizes, one view)."""

import functools
import json

from kvscope.app.cli.main import main
from kvscope.app.desktop.blockmap import redraw_bench


def test_bench_map_writes_its_figures(tmp_path, monkeypatch, capsys, qapp):
    small = functools.partial(
        redraw_bench.run_map_redraw_bench,
        pool_sizes=(64, 20_000),
        view_sizes=((400, 200),),
        repeats=3,
    )
    monkeypatch.setattr(redraw_bench, "run_map_redraw_bench", small)
    assert main(["bench", "--map", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench_map.json").read_text())
    modes = {(r["blocks"], r["pool"]): r["mode"] for r in report["runs"]}
    assert modes[(64, "realistic")] == "one cell per block"
    assert modes[(20_000, "busy")] == "overview + lens"
    assert all(r["median_ms"] > 0 for r in report["runs"])
    out = capsys.readouterr().out
    assert "20,000 blocks busy" in out and "frame budget" in out
