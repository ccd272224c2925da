"""The soak's figures and verdict: percentiles and counts from the clients' results, the per-
interval line it prints, the summary, and the invariants a sound server never breaks (the exit
status of `kvscope bench --soak`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvscope.app.bench.soak.hostile_clients import HostileResult
from kvscope.app.bench.soak.polite_clients import PoliteResult

# A hostile what-if trace must be refused within this (the slowest, a 1M-token prompt a token a
# step, stops at its 1 s time budget).
WHATIF_REFUSAL_S = 10.0
# The remote view's GUI thread (gui_probe) may stand still this long at most: a hang detector,
# generous for 2 loaded cores, not a frame budget (the probe's figures are reported either way).
GUI_GAP_BOUND_MS = 2000.0


def pct(values, q) -> float | None:
    return round(float(np.percentile(values, q)), 3) if len(values) else None


def latencies(results: list[PoliteResult]) -> dict:
    ok = [r.latency_s for r in results if r.ok]
    return {"p50_s": pct(ok, 50), "p99_s": pct(ok, 99), "max_s": pct(ok, 100)}


def counts(polite: list[PoliteResult], hostile: list[HostileResult]) -> dict:
    return {
        "polite_sent": len(polite),
        "polite_ok": sum(r.ok for r in polite),
        "polite_lost": sum(not r.ok for r in polite),
        "hostile_sent": len(hostile),
        "hostile_as_expected": sum(r.expected for r in hostile),
        "hostile_unexpected": sum(not r.expected for r in hostile),
        "server_errors_5xx": sum(r.server_error for r in hostile),
    }


def rss_summary(values: list[float | None]) -> dict:
    seen = [v for v in values if v is not None]
    if not seen:
        return {"first": None, "last": None, "max": None}
    return {"first": round(seen[0], 1), "last": round(seen[-1], 1), "max": round(max(seen), 1)}


def by_action(hostile: list[HostileResult]) -> dict:
    out: dict[str, dict] = {}
    for r in hostile:
        # "answer": the first reply seen, so a report says what "as expected" was (a 200 or a 400)
        row = out.setdefault(
            r.action, {"sent": 0, "as_expected": 0, "answer": r.detail, "unexpected": []}
        )
        row["sent"] += 1
        row["as_expected"] += r.expected
        if not r.expected and len(row["unexpected"]) < 3:
            row["unexpected"].append(r.detail)
    return out


def log_figures(path: Path) -> dict:
    text = path.read_text(errors="replace")
    return {
        "bytes": path.stat().st_size,
        "lines": text.count("\n"),
        "tracebacks": text.count("Traceback (most recent call last)"),
        "path": str(path),
    }


def broken_invariants(report: dict) -> list[str]:
    """What a sound server breaks nowhere: every well-behaved request whole, nothing held once
    idle, still answering, no 5xx to a hostile request, the remote view's snapshots unharmed,
    the GUI's remote view probe ended well and its GUI thread never stood still past
    GUI_GAP_BOUND_MS; and every hostile what-if trace refused, each within WHATIF_REFUSAL_S."""
    end, totals = report["end"], report["totals"]
    broken = []
    if totals["polite_lost"]:
        broken.append(f"{totals['polite_lost']} well-behaved requests lost")
    if end["running"] != 0 or end["waiting"] != 0:
        broken.append(f"running {end['running']}, waiting {end['waiting']} once idle")
    if end["kv_blocks_used"] != 0:
        broken.append(f"{end['kv_blocks_used']} KV blocks still in use once idle")
    if not end["server_answering"]:
        broken.append(f"the server no longer answers: {end['probe_error']}")
    if totals["server_errors_5xx"]:
        broken.append(f"{totals['server_errors_5xx']} hostile requests got a 5xx")
    peer = report.get("peer")
    if peer and peer["snapshot_failures"]:
        broken.append(f"remote snapshots failed: {peer['snapshot_failures'][0]}")
    broken += _gui_broken(report.get("gui"))
    for row in report.get("whatif_hostile", []):
        if not row["refused"]:
            broken.append(f"what-if {row['case']}: not refused: {row['message']}")
        elif row["seconds"] > WHATIF_REFUSAL_S:
            broken.append(f"what-if {row['case']}: refused only after {row['seconds']} s")
    return broken


def _gui_broken(gui: dict | None) -> list[str]:
    if not gui:
        return []
    if gui["exit_status"] != 0 or gui["error"]:
        return [f"the GUI probe exited {gui['exit_status']}: {gui['error'] or gui['log_tail']}"]
    if gui["max_gap_ms"] is None or gui["max_gap_ms"] > GUI_GAP_BOUND_MS:
        return [f"the GUI thread stood still {gui['max_gap_ms']} ms (bound {GUI_GAP_BOUND_MS:g})"]
    return []


def gui_line(gui: dict | None) -> str:
    if not gui:
        return "  GUI probe: not run (no hostile peer)"
    if "max_gap_ms" not in gui:
        return f"  GUI probe: exit {gui['exit_status']}, {gui['error']}"
    view = gui.get("view", {})
    return (
        f"  GUI (remote view on the peer, {gui['platform']}): max gap {gui['max_gap_ms']} ms, "
        f"p99 {gui['p99_gap_ms']} ms, {gui['gaps_over_250ms']} gaps > 250 ms in "
        f"{gui['ticks']} ticks; frames applied {view.get('frames_applied')}, malformed "
        f"{view.get('malformed')}"
    )


def sample_line(x: dict) -> str:
    def mb(v):
        return "n/a" if v is None else f"{v:.0f} MB"

    lat = x["window"]
    p99 = "n/a" if lat["p99_s"] is None else f"{lat['p99_s']:.2f} s"
    peer = x.get("peer", {})
    return (
        f"  t={x['t_s']:>6.0f}s server {mb(x['server_rss_mb'])} ({x['server_fds']} fds), "
        f"soak {mb(x['soak_rss_mb'])}; polite {x['polite_ok']}/{x['polite_sent']} ok, "
        f"{x['polite_lost']} lost, p99 {p99}; hostile {x['hostile_as_expected']}/"
        f"{x['hostile_sent']} as expected; peer blocks {peer.get('cached_blocks')}, "
        f"snapshot max {peer.get('snapshot_max_ms')} ms"
    )


def summarize(report: dict) -> str:
    t, lat, end = report["totals"], report["latency"], report["end"]
    rss = [x["server_rss_mb"] for x in report["samples"] if x["server_rss_mb"] is not None]
    broken = broken_invariants(report)
    lines = [
        f"soak: {report['soak_minutes']:g} min, well-behaved {t['polite_ok']}/{t['polite_sent']} "
        f"ok ({t['polite_lost']} lost), p50 {lat['p50_s']} s, p99 {lat['p99_s']} s",
        f"  hostile: {t['hostile_as_expected']}/{t['hostile_sent']} answered as expected, "
        f"{t['server_errors_5xx']} 5xx",
        f"  server RSS {rss[0]:.0f} -> {rss[-1]:.0f} MB (max {max(rss):.0f}); at the end "
        f"running {end['running']}, KV blocks in use {end['kv_blocks_used']}, "
        f"{end['server_fds']} fds, answering: {end['server_answering']}"
        if rss
        else "  server RSS not readable here",
        f"  server log: {report['server_log']['lines']} lines, "
        f"{report['server_log']['tracebacks']} tracebacks",
        gui_line(report.get("gui")),
        *(
            f"  what-if {row['case']}: "
            + ("refused" if row["refused"] else "NOT refused")
            + f" in {row['seconds']} s, peak RSS +{row['peak_rss_delta_mb']} MB"
            for row in report.get("whatif_hostile", [])
        ),
        "  invariants: held" if not broken else "  invariants BROKEN: " + "; ".join(broken),
    ]
    return "\n".join(lines)
