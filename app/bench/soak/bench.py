"""`kvscope bench --soak MINUTES`: `kvscope serve` in a process of its own on 127.0.0.1, driven
for MINUTES by well-behaved clients (polite_clients) beside hostile ones (hostile_clients:
dropped streams, impatient clients, half-open and slowloris sockets, oversized and absurd
requests), while the project's remote monitor follows a hostile vLLM-like peer (hostile_peer)
and, in a child process, the desktop app's remote view follows it too, its GUI thread timed
(gui_probe).

Every few seconds it records the server's RSS and open descriptors, this process's RSS (the
clients and the remote monitor), requests sent / ok / lost and refused as expected, and the
well-behaved clients' latency. At the end, once the server is idle: its KV blocks in use and
running requests (both must be 0), whether it still answers, and what it logged. The figures
are reported, not judged against a speed; the invariants (nothing lost, nothing left held, still
answering) set the exit status. Bounded: clients stop at the deadline, the requests in flight
then end within their timeouts, the peer's every answer has a cap."""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvscope.app.bench.machine import machine_info
from kvscope.app.bench.serving.bench import (
    SERVER_START_TIMEOUT_S,
    _free_port,
    _scrape,
    _stop_server,
    _wait_until_up,
)
from kvscope.app.bench.soak.gui_probe import GuiProbe
from kvscope.app.bench.soak.hostile_clients import HostileResult, SlowSockets, hostile_actions
from kvscope.app.bench.soak.hostile_peer import HostilePeer
from kvscope.app.bench.soak.hostile_whatif import run_hostile_whatif
from kvscope.app.bench.soak.polite_clients import (
    KINDS,
    POLITE_TIMEOUT_S,
    PoliteResult,
    polite_request,
)
from kvscope.app.bench.soak.report import (
    broken_invariants,
    by_action,
    counts,
    latencies,
    log_figures,
    pct,
    rss_summary,
    sample_line,
    summarize,
)
from kvscope.app.bench.soak.watch import PeerWatch, open_fds, rss_mb

IDLE_TIMEOUT_S = 60.0  # after the load: the server must be idle by then
HOSTILE_PAUSE_S = 0.2


@dataclass
class SoakSettings:
    minutes: float
    out: Path = Path("bench_out")
    json_path: Path | None = None  # None: <out>/bench_soak.json; the other files go beside it
    polite_clients: int = 3
    hostile_clients: int = 1
    max_tokens: int = 16
    half_open: int = 64
    slowloris: int = 16
    with_peer: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.minutes <= 24 * 60:
            raise ValueError(f"--soak takes minutes in (0, 1440], got {self.minutes}")
        if self.polite_clients < 1 or self.hostile_clients < 0:
            raise ValueError("a soak needs >= 1 polite client and >= 0 hostile ones")

    @property
    def seconds(self) -> float:
        return self.minutes * 60

    @property
    def report_every_s(self) -> float:
        return min(30.0, max(2.0, self.seconds / 12))

    @property
    def report_path(self) -> Path:
        return self.json_path or self.out / "bench_soak.json"

    def beside_report(self, ending: str) -> Path:
        """A file the soak writes, named after its report and in the report's folder: `--json
        elsewhere/x.json` puts x.png and x_server.log there, nothing in `--out`."""
        return self.report_path.with_name(self.report_path.stem + ending)


class Tally:
    """Every result, by the clients' threads; read by the sampler."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.polite: list[PoliteResult] = []
        self.hostile: list[HostileResult] = []

    def add(self, result) -> None:
        with self.lock:
            (self.polite if isinstance(result, PoliteResult) else self.hostile).append(result)


def _wait_idle(port: int) -> dict[str, float]:
    """The server's metrics once nothing runs or waits (or at the idle timeout). Two scrapes in a
    row must agree: the engine thread sets the gauges one by one after the step whose outputs a
    client may already have read, so a single scrape can mix two steps."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    keys = ("vllm:num_requests_running", "vllm:num_requests_waiting", "kvscope_kv_blocks_used")
    previous = None
    while True:
        values = _scrape("127.0.0.1", port, None)
        seen = tuple(values.get(k) for k in keys)
        if (seen[:2] == (0, 0) and seen == previous) or time.monotonic() > deadline:
            return values
        previous = seen
        time.sleep(0.5)


class Soak:
    def __init__(self, settings: SoakSettings, server_cmd: list[str], port: int) -> None:
        self.settings, self.server_cmd, self.port = settings, server_cmd, port
        self.tally = Tally()
        self.samples: list[dict] = []
        self._stop = threading.Event()

    def _polite_loop(self, model: str, first_k: int) -> None:
        k = first_k
        while not self._stop.is_set():
            self.tally.add(
                polite_request("127.0.0.1", self.port, model, k, self.settings.max_tokens)
            )
            k += self.settings.polite_clients

    def _hostile_loop(self, model: str) -> None:
        while not self._stop.is_set():
            for action in hostile_actions("127.0.0.1", self.port, model):
                if self._stop.is_set():
                    return
                self.tally.add(action())
                self._stop.wait(HOSTILE_PAUSE_S)

    def _sample(self, started: float, pid: int, slow: SlowSockets | None, watch) -> dict:
        now = time.monotonic()
        window_start = now - self.settings.report_every_s
        with self.tally.lock:
            polite, hostile = list(self.tally.polite), list(self.tally.hostile)
        sample = {
            "t_s": round(now - started, 1),
            "server_rss_mb": rss_mb(pid),
            "soak_rss_mb": rss_mb(),
            "server_fds": open_fds(pid),
            **counts(polite, hostile),
            "window": latencies([r for r in polite if r.finished_at >= window_start]),
            "overall": latencies(polite),
        }
        if slow is not None:
            sample["slow_sockets_held"] = slow.held()
            sample["slow_sockets_closed_by_server"] = sum(slow.closed_by_server.values())
        if watch is not None:
            sample["peer"] = watch.take()
        return sample

    def run(self) -> dict:
        s = self.settings
        s.report_path.parent.mkdir(parents=True, exist_ok=True)
        log_path = s.beside_report("_server.log")
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                self.server_cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
            try:
                model = _wait_until_up(proc, self.port, SERVER_START_TIMEOUT_S)
                report = self._drive(proc, model)
            finally:
                _stop_server(proc)
        report["server_log"] = log_figures(log_path)
        report["server_exit_status"] = proc.returncode
        return report

    def _drive(self, proc: subprocess.Popen, model: str) -> dict:
        s = self.settings
        warm = polite_request("127.0.0.1", self.port, model, 0, s.max_tokens)  # caches the prompt
        peer = HostilePeer().start() if s.with_peer else None
        watch = PeerWatch(peer).start() if peer is not None else None
        gui = None
        if peer is not None:  # the view's figures end with the load: it runs as long
            probe_files = s.beside_report("_gui_probe.json"), s.beside_report("_gui_probe.log")
            gui = GuiProbe(peer, s.seconds, *probe_files).start()
        slow = SlowSockets("127.0.0.1", self.port, s.half_open, s.slowloris).start()
        threads = [
            threading.Thread(target=self._polite_loop, args=(model, i), daemon=True)
            for i in range(s.polite_clients)
        ] + [
            threading.Thread(target=self._hostile_loop, args=(model,), daemon=True)
            for _ in range(s.hostile_clients)
        ]
        started = time.monotonic()
        for t in threads:
            t.start()
        deadline = started + s.seconds
        while time.monotonic() < deadline:
            time.sleep(min(s.report_every_s, max(0.0, deadline - time.monotonic())))
            self.samples.append(self._sample(started, proc.pid, slow, watch))
            print(sample_line(self.samples[-1]), flush=True)
        self._stop.set()
        for t in threads:  # the requests in flight end within their own timeouts
            t.join(timeout=POLITE_TIMEOUT_S + 10)
        load_s = time.monotonic() - started
        slow_figures = {
            "opened": slow.opened,
            "closed_by_server": slow.closed_by_server,
            "connects_refused": slow.refused,
            "held_at_end": slow.held(),
            "median_lifetime_s": pct(slow.lifetimes, 50),
        }
        slow.stop()
        gui_figures = gui.finish() if gui is not None else None  # before the peer stops
        peer_figures = None
        if watch is not None and peer is not None:
            peer_figures = {
                "last": watch.take(),
                "snapshots": watch.snapshots,
                "snapshot_failures": watch.failures[:5],
                "snapshot_max_ms": round(watch.worst_ms_overall, 1),
                "sent": dict(peer.counts),
                **watch.stop(),
            }
            peer.stop()
        # Idle after the load, then once more after the probe (a request the server must still
        # serve whole): what the end reports is read from that last idle state.
        probe = None
        idle: Mapping[str, float | str]
        try:
            _wait_idle(self.port)
            probe = polite_request("127.0.0.1", self.port, model, 1, s.max_tokens)
            idle = _wait_idle(self.port)
        except (OSError, http.client.HTTPException, ValueError) as e:  # reported, not raised
            idle = {"scrape_error": f"{type(e).__name__}: {e}"}
        with self.tally.lock:
            polite, hostile = list(self.tally.polite), list(self.tally.hostile)
        end = {
            "running": idle.get("vllm:num_requests_running"),
            "waiting": idle.get("vllm:num_requests_waiting"),
            "kv_blocks_used": idle.get("kvscope_kv_blocks_used"),
            "kv_cache_usage_perc": idle.get("vllm:kv_cache_usage_perc"),
            "scrape_error": idle.get("scrape_error", ""),
            "server_answering": probe is not None and probe.ok,
            "probe_error": "never sent: the server was not idle" if probe is None else probe.error,
            "server_fds": open_fds(proc.pid),
            "server_rss_mb": rss_mb(proc.pid),
        }
        return {
            "soak_minutes": s.minutes,
            "load_seconds": round(load_s, 1),
            "warm_up_ok": warm.ok,
            "settings": {
                "polite_clients": s.polite_clients,
                "hostile_clients": s.hostile_clients,
                "max_tokens": s.max_tokens,
                "half_open": s.half_open,
                "slowloris": s.slowloris,
                "server_command": " ".join(self.server_cmd[1:]),
            },
            "totals": counts(polite, hostile),
            "latency": latencies(polite),
            "latency_by_kind": {
                kind: latencies([r for r in polite if r.kind == kind]) for kind in KINDS
            },
            "rss_mb": {
                who: rss_summary([x[f"{who}_rss_mb"] for x in self.samples])
                for who in ("server", "soak")
            },
            "lost": [f"{r.kind}: {r.error}" for r in polite if not r.ok][:10],
            "hostile_by_action": by_action(hostile),
            "slow_sockets": slow_figures,
            "peer": peer_figures,
            "gui": gui_figures,
            "end": end,
            "samples": self.samples,
            "machine": machine_info(),
        }


def run_soak_bench(args: argparse.Namespace) -> int:
    """`kvscope bench --soak MINUTES [--json PATH]`."""
    from kvscope.app.bench.serving.bench import server_command
    from kvscope.app.bench.soak.plot import plot_soak

    settings = SoakSettings(
        minutes=args.soak,
        out=Path(args.out),
        json_path=Path(args.json) if getattr(args, "json", None) else None,
    )
    with tempfile.TemporaryDirectory(prefix="kvscope_soak_whatif_") as folder:
        whatif_rows = run_hostile_whatif(Path(folder))  # before the server: nothing else runs
    port = _free_port()
    report = Soak(settings, server_command(args, port, settings.polite_clients), port).run()
    report["whatif_hostile"] = whatif_rows
    path, png = settings.report_path, settings.beside_report(".png")
    path.write_text(json.dumps(report, indent=2))
    plot_soak(report, png)
    print(summarize(report))
    print(f"  wrote {path} and {png}")
    return 1 if broken_invariants(report) else 0
