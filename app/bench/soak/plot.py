"""bench_soak.png: what the soak recorded over time, one panel per question it answers (is memory
flat, do well-behaved clients stay served, are descriptors released, does the remote view keep
up with the hostile peer)."""

from __future__ import annotations

from pathlib import Path

# The object-oriented API renders with Agg without touching pyplot's global backend.
from matplotlib.figure import Figure


def _series(samples: list[dict], *keys: str) -> list:
    out = []
    for sample in samples:
        x: object = sample
        for key in keys:
            x = x.get(key) if isinstance(x, dict) else None
        out.append(float("nan") if x is None else x)
    return out


def plot_soak(report: dict, path: Path) -> None:
    samples = report["samples"]
    t = [x["t_s"] for x in samples]
    fig = Figure(figsize=(12, 7), layout="constrained")
    (rss, lat), (fds, peer) = fig.subplots(2, 2)

    rss.plot(t, _series(samples, "server_rss_mb"), label="server (kvscope serve)")
    rss.plot(t, _series(samples, "soak_rss_mb"), label="soak: clients + remote monitor")
    rss.set_title("RSS")
    rss.set_ylabel("MiB")

    lat.plot(t, _series(samples, "window", "p50_s"), label="p50")
    lat.plot(t, _series(samples, "window", "p99_s"), label="p99")
    lost = _series(samples, "polite_lost")
    lat.set_title(f"Well-behaved latency per interval (lost at the end: {lost[-1] if lost else 0})")
    lat.set_ylabel("s")

    fds.plot(t, _series(samples, "server_fds"), label="server open fds")
    fds.plot(t, _series(samples, "slow_sockets_held"), label="half-open + slowloris held")
    fds.set_title("Descriptors")

    peer.plot(t, _series(samples, "peer", "cached_blocks"), label="cached blocks")
    twin = peer.twinx()
    twin.plot(t, _series(samples, "peer", "snapshot_max_ms"), color="#d9822b", label="snapshot max")
    twin.set_ylabel("snapshot ms")
    peer.set_title("Remote view of the hostile peer")
    for ax in (rss, lat, fds, peer):
        ax.set_xlabel("s into the soak")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    twin.legend(loc="upper right", fontsize=8)
    fig.suptitle(f"KVScope soak: {report['soak_minutes']:g} min against kvscope serve")
    fig.savefig(path, dpi=100)
