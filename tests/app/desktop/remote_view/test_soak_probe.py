"""The soak's GUI probe (app/desktop/remote_view/soak_probe.py), in this process: the real remote
view on the soak's hostile peer for a few seconds, its GUI thread timed; the gap figures; a
connection it cannot use."""

from __future__ import annotations

import json

from kvscope.app.bench.soak.hostile_peer import HostilePeer
from kvscope.app.desktop.remote_view.soak_probe import STALL_MS, gap_figures, main


def test_the_probe_times_the_gui_thread_with_the_view_on_the_hostile_peer(qtbot, tmp_path):
    peer = HostilePeer(seed=2).start()
    out = tmp_path / "probe.json"
    try:
        status = main(
            [
                "--metrics-url",
                peer.url,
                "--kv-events",
                peer.pub_endpoint,
                "--kv-replay",
                peer.replay_endpoint,
                "--seconds",
                "3",
                "--json",
                str(out),
            ]
        )
    finally:
        peer.stop()
    assert status == 0
    figures = json.loads(out.read_text())
    assert figures["ticks"] > 100, figures  # 300 at 10 ms; fewer on a loaded machine
    assert figures["max_gap_ms"] >= figures["p99_gap_ms"] >= figures["median_gap_ms"] > 0
    view = figures["view"]
    assert view["replicas_shown"] == 1 and view["polls"] > 0, view
    assert view["frames_applied"] > 0, view  # the peer's frames reached the view
    assert view["malformed"] > 0, view  # and its garbage was counted, not applied


def test_gap_figures():
    at = [0.0, 0.01, 0.02, 0.5, 0.51]  # one 480 ms stall among 10 ms ticks
    figures = gap_figures(at)
    assert figures["ticks"] == 4 and figures["gaps_over_250ms"] == 1
    assert figures["max_gap_ms"] == 480.0 and figures["median_gap_ms"] == 10.0
    assert figures["stalls"] == [{"at_s": 0.02, "ms": 480.0}]  # when it began, how long
    assert STALL_MS == 250
    assert gap_figures([1.0])["max_gap_ms"] is None


def test_a_connection_it_cannot_use_exits_2(tmp_path, capsys):
    out = tmp_path / "x.json"
    status = main(["--metrics-url", "ftp://x", "--seconds", "1", "--json", str(out)])
    assert status == 2 and not out.exists()
    assert "http://" in capsys.readouterr().err
