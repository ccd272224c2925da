"""`kvscope bench --soak`: a 20-second soak through the real CLI (`kvscope serve` in a process of
its own, the bundled model, well-behaved and hostile clients, the hostile peer followed by the
remote monitor, and the desktop app's remote view in a child process, its GUI thread timed),
judged on its invariants, never on speed: no well-behaved request lost, nothing running and no KV
block held once idle, the server still answering, no 5xx to a hostile request, the GUI thread
never frozen, RSS recorded. Plus the pieces that can be checked without a server: the
invariants' judge and the hostile peer's bounds."""

from __future__ import annotations

import json
import time

import pytest
from remote_fakes import wait_until

from kvscope.app.bench.soak.bench import SoakSettings
from kvscope.app.bench.soak.hostile_peer import HostilePeer
from kvscope.app.bench.soak.hostile_whatif import run_hostile_whatif
from kvscope.app.bench.soak.report import (
    GUI_GAP_BOUND_MS,
    WHATIF_REFUSAL_S,
    broken_invariants,
    summarize,
)
from kvscope.app.bench.soak.watch import PeerWatch
from kvscope.app.cli.main import main


@pytest.mark.slow
def test_a_short_soak_holds_its_invariants(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # --out left at its default, bench_out in the working directory
    json_path = tmp_path / "elsewhere" / "report.json"
    started = time.monotonic()
    status = main(["bench", "--soak", "0.33", "--json", str(json_path)])
    report = json.loads(json_path.read_text())
    assert broken_invariants(report) == [], json.dumps(report, indent=1)[:5000]
    assert status == 0
    assert time.monotonic() - started < 300  # bounded: a hang, not a speed figure

    totals, end = report["totals"], report["end"]
    assert totals["polite_sent"] > 0 and totals["polite_lost"] == 0
    assert end["running"] == 0 and end["waiting"] == 0 and end["kv_blocks_used"] == 0
    assert end["server_answering"]
    # The hostile round was under way (20 s may not reach its heavy last requests), and a sound
    # server answers each as expected.
    hostile = report["hostile_by_action"]
    assert {"dropped stream", "impatient whole request", "huge max_tokens"} <= set(hostile)
    assert all(row["as_expected"] == row["sent"] for row in hostile.values()), hostile
    assert totals["hostile_sent"] > 0 and totals["server_errors_5xx"] == 0
    # RSS over time, from /proc, for the server and for this side.
    samples = report["samples"]
    assert len(samples) >= 5
    assert all(x["server_rss_mb"] > 50 and x["soak_rss_mb"] > 50 for x in samples)
    assert report["slow_sockets"]["opened"]["half-open"] > 0
    peer = report["peer"]
    assert peer["sent"]["batches"] > 0 and peer["snapshots"] > 0
    assert peer["monitor_stopped"]
    # The GUI leg: the remote view open on the same peer in a child process, for the whole load,
    # its GUI thread ticking every 10 ms; it applied the peer's frames and counted its garbage.
    gui = report["gui"]
    assert gui["exit_status"] == 0 and not gui["killed"] and gui["error"] == "", gui
    assert gui["platform"] == "offscreen"
    assert gui["max_gap_ms"] < GUI_GAP_BOUND_MS and gui["ticks"] > 500, gui
    assert gui["view"]["frames_applied"] > 0 and gui["view"]["malformed"] > 0, gui
    assert gui["wall_s"] < report["load_seconds"] + 30, gui
    assert "GUI (remote view on the peer" in summarize(report)
    assert (json_path.parent / "report_gui_probe.json").exists()
    # Its files beside its --json, none in the working directory.
    assert (json_path.parent / "report.png").stat().st_size > 10_000
    assert (json_path.parent / "report_server.log").exists()
    assert list(cwd.iterdir()) == []
    # The what-if leg: every hostile trace refused, quickly, without the memory it asked for.
    whatif = {row["case"]: row for row in report["whatif_hostile"]}
    assert len(whatif) == 5 and all(row["refused"] for row in whatif.values()), whatif
    assert all(row["seconds"] < WHATIF_REFUSAL_S for row in whatif.values()), whatif
    assert all(row["peak_rss_delta_mb"] < 300 for row in whatif.values()), whatif


def test_the_soaks_files_go_beside_its_report(tmp_path):
    elsewhere = SoakSettings(1, out=tmp_path / "out", json_path=tmp_path / "x" / "night.json")
    assert elsewhere.beside_report(".png") == tmp_path / "x" / "night.png"
    assert elsewhere.beside_report("_server.log") == tmp_path / "x" / "night_server.log"
    default = SoakSettings(1, out=tmp_path / "out")
    assert default.report_path == tmp_path / "out" / "bench_soak.json"
    assert default.beside_report(".png") == tmp_path / "out" / "bench_soak.png"


def _report(**changes) -> dict:
    report = {
        "totals": {"polite_lost": 0, "server_errors_5xx": 0},
        "end": {
            "running": 0,
            "waiting": 0,
            "kv_blocks_used": 0,
            "server_answering": True,
            "probe_error": "",
        },
        "peer": {"snapshot_failures": []},
        "gui": {"exit_status": 0, "error": "", "log_tail": "", "max_gap_ms": 120.0},
        "whatif_hostile": [{"case": "nan", "refused": True, "message": "m", "seconds": 0.1}],
    }
    for key, value in changes.items():
        section, field = key.split("__")
        report[section][field] = value
    return report


def test_each_broken_invariant_is_named():
    assert broken_invariants(_report()) == []
    cases = {
        "totals__polite_lost": (2, "2 well-behaved requests lost"),
        "end__kv_blocks_used": (29, "29 KV blocks still in use"),
        "end__running": (1, "running 1"),
        "end__server_answering": (False, "no longer answers"),
        "totals__server_errors_5xx": (3, "3 hostile requests got a 5xx"),
        "peer__snapshot_failures": (["TypeError: x"], "remote snapshots failed"),
        "gui__exit_status": (1, "the GUI probe exited 1"),
        "gui__error": ("killed after 80 s; no figures", "killed after 80 s"),
        "gui__max_gap_ms": (3700.0, "the GUI thread stood still 3700.0 ms"),
    }
    for key, (value, words) in cases.items():
        broken = broken_invariants(_report(**{key: value}))
        assert len(broken) == 1 and words in broken[0], (key, broken)
    ran = {"case": "nan", "refused": False, "message": "8 simulations", "seconds": 0.1}
    [broken] = broken_invariants({**_report(), "whatif_hostile": [ran]})
    assert broken == "what-if nan: not refused: 8 simulations"
    slow = {"case": "nan", "refused": True, "message": "m", "seconds": 60.0}
    [broken] = broken_invariants({**_report(), "whatif_hostile": [slow]})
    assert "refused only after 60.0 s" in broken


def test_every_hostile_whatif_trace_is_refused_in_bounded_time_and_memory(tmp_path):
    """Issue 43's what-if bombs, as `kvscope whatif` reads and runs them: each a clear refusal
    (the reader's, the knobs' bound, the simulation's budget), none building what it asks for."""
    started = time.monotonic()
    rows = {row["case"]: row for row in run_hostile_whatif(tmp_path)}
    assert time.monotonic() - started < 30  # a few seconds; a hang would be minutes
    assert all(row["refused"] for row in rows.values()), rows
    assert "trace_request.time is nan" in rows["NaN arrival, rate_scale=2"]["message"]
    assert "16,777,216" in rows["header num_blocks 10^8"]["message"]
    assert "at most" in rows["--set num_blocks=100000000"]["message"]
    assert "time budget" in rows["1M-token prompt, max_batched_tokens=1"]["message"]
    assert "trace_step.duration is inf" in rows["infinite step duration"]["message"]
    assert all(row["peak_rss_delta_mb"] < 300 for row in rows.values()), rows


def test_soak_settings_refuse_absurd_durations():
    for minutes in (0, -1, 10_000):
        with pytest.raises(ValueError, match="--soak"):
            SoakSettings(minutes=minutes)
    assert SoakSettings(minutes=0.33).report_every_s == 2.0
    assert SoakSettings(minutes=10).report_every_s == 30.0


def test_the_hostile_peer_is_seen_by_the_monitor_and_stays_bounded():
    """The peer's garbage reaches the remote monitor (malformed frames counted, blocks cached),
    its snapshots never fail, and both stop promptly."""
    peer = HostilePeer(seed=1).start()
    watch = PeerWatch(peer).start()
    try:
        wait_until(lambda: (watch.take().get("malformed") or 0) > 0, 20, "a malformed frame")
        assert peer.counts["batches"] > 0
        assert watch.failures == []
    finally:
        stopped = watch.stop()
        peer.stop()
    assert stopped["monitor_stopped"], stopped
