"""`kvscope bench --serve`: N concurrent streaming clients against `kvscope serve` on 127.0.0.1.

Agent-style traffic: every request carries the same long system prompt (the bundled workload's
agent prompt, ~1,400 tokens) and a question of its own. One uncounted request goes first and
caches that prompt, as an agent's first call would; the concurrent ones then share it.
The server runs as `kvscope serve` in a process of its own; each client is a thread with a plain
HTTP/1.1 connection (the stdlib, no extra client library), reading the SSE stream as it arrives.
Bounded by a request count and a wall-clock limit: no new request starts after the limit, and
the streams still open then are cut and counted apart from lost ones (errors, broken streams).

Reports requests/s, output tokens/s, time to first token and inter-token latency (p50/p99, as
the client sees them: first content chunk, gaps between content chunks), prefix-cache hit rate
(from the server's own vllm:prefix_cache_* counters, None on a server without them) and how many
requests were lost. `--target URL` drives a server that is already running instead, any
OpenAI-compatible one (the client is app/bench/serving/stream.py); `--peer-server llama.cpp` runs
ours and llama.cpp's `llama-server` in turn on the same GGUF (app/bench/serving/peer.py)."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from kvscope.app.bench.cpu_model import cpu_model_name
from kvscope.app.bench.machine import machine_info
from kvscope.app.bench.serving.metrics import delta, other_counters, scrape, scrape_or_note
from kvscope.app.bench.serving.stream import CUT, OpenConnections, RequestResult, stream_one
from kvscope.app.bench.serving.stream import (
    agent_messages as agent_messages,  # polite_clients' import
)
from kvscope.engine.child_python import python_module_command

SERVER_START_TIMEOUT_S = 300.0  # loading the model on a busy machine


@dataclass
class ServeBenchSettings:
    clients: int = 64
    requests: int | None = None  # None: 2 per client
    seconds: float = 120.0
    max_tokens: int = 32
    system_chars: int | None = None  # cut the shared system prompt (tests, small contexts)
    out: Path = Path("bench_out")
    # After the one warm-up request, `clients` more at once, uncounted, bounded by this many
    # seconds (0: none): a server whose prompt cache is per slot (llama-server's) then holds the
    # shared prompt in every slot the cell will use, as it does once it has served a while.
    warm_round_s: float = 0.0

    def __post_init__(self) -> None:
        if self.clients < 1:
            raise ValueError(f"clients must be >= 1, got {self.clients}")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if not self.seconds > 0:
            raise ValueError(f"seconds must be > 0, got {self.seconds}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.warm_round_s < 0:
            raise ValueError(f"warm_round_s must be >= 0, got {self.warm_round_s}")

    @property
    def total_requests(self) -> int:
        return self.requests if self.requests is not None else 2 * self.clients


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _token_source(results: list[RequestResult]) -> str | None:
    sources = {r.tokens_from for r in results}
    return sources.pop() if len(sources) == 1 else ("mixed" if sources else None)


def _drive(host, port, model, settings, api_key, ks: range, seconds: float):
    """`settings.clients` threads streaming requests numbered `ks` until they run out or
    `seconds` pass (then what still streams is cut); the results and the wall time."""
    next_k = iter(ks)
    lock = threading.Lock()
    results: list[RequestResult] = []
    started = time.perf_counter()
    deadline = started + seconds
    conns = OpenConnections()

    def client() -> None:
        while time.perf_counter() < deadline:
            with lock:
                k = next(next_k, None)
            if k is None:
                return
            r = stream_one(host, port, model, k, settings, api_key, conns)
            with lock:
                results.append(r)

    with ThreadPoolExecutor(max_workers=settings.clients) as pool:
        futures = [pool.submit(client) for _ in range(settings.clients)]
        # The time bound: at the deadline, requests still streaming are cut (and counted).
        wait(futures, timeout=max(0.0, deadline - time.perf_counter()))
        conns.cut_all()
    return results, time.perf_counter() - started


def _warm_round(host, port, model, settings, api_key) -> dict:
    """`clients` uncounted requests at once (numbered below the warm-up's -1)."""
    ks = range(-2, -2 - settings.clients, -1)
    results, elapsed = _drive(host, port, model, settings, api_key, ks, settings.warm_round_s)
    return {
        "requests": settings.clients,
        "completed": sum(r.ok for r in results),
        "seconds": elapsed,
        "errors": sorted({r.error for r in results if r.error})[:5],
    }


def run_load(host, port, model, settings: ServeBenchSettings, api_key: str | None = None) -> dict:
    """Drive the server with `settings.clients` concurrent streams; the report (no files).

    One request goes first, alone and not counted, as an agent's first call does: it puts the
    shared system prompt in the prefix cache that the concurrent requests then share (and with
    `warm_round_s`, a round of `clients` more; see ServeBenchSettings). The vLLM counters
    (prefix hits, preemptions) are None on a server that does not export them."""
    warm = stream_one(host, port, model, -1, settings, api_key)
    if not warm.ok:
        raise RuntimeError(f"the warm-up request failed: {warm.error}")
    warm_round = (
        _warm_round(host, port, model, settings, api_key) if settings.warm_round_s else None
    )
    before, metrics_note = scrape_or_note(host, port, api_key)
    total = settings.total_requests
    results, elapsed = _drive(host, port, model, settings, api_key, range(total), settings.seconds)
    time.sleep(0.5)  # let the server abort what was cut before reading its counters
    after = scrape_or_note(host, port, api_key)[0] if before else {}
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    gaps = [g for r in ok for g in r.gaps]
    queries = delta(before, after, "vllm:prefix_cache_queries_total")
    hits = delta(before, after, "vllm:prefix_cache_hits_total")
    told = [r for r in ok if r.cached_tokens is not None and r.prompt_tokens]
    prompts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    return {
        "clients": settings.clients,
        "requests_planned": total,
        "requests_sent": len(results),
        "requests_completed": len(ok),
        "requests_cut_at_time_bound": sum(r.error == CUT for r in results),
        # Lost: failed for any reason but the time bound (an error, a stream that broke off).
        "requests_lost": sum(not r.ok and r.error != CUT for r in results),
        "errors": sorted({r.error for r in results if r.error and r.error != CUT})[:5],
        "seconds": elapsed,
        "time_bound_s": settings.seconds,
        "requests_per_s": len(ok) / elapsed,
        "output_tokens_per_s": sum(r.tokens for r in ok) / elapsed,
        "output_tokens_counted_from": _token_source(ok),
        "mean_output_tokens": float(np.mean([r.tokens for r in ok])) if ok else None,
        "ttft_p50_s": _pct(ttfts, 50),
        "ttft_p99_s": _pct(ttfts, 99),
        "itl_p50_s": _pct(gaps, 50),
        "itl_p99_s": _pct(gaps, 99),
        "prefix_hit_rate": hits / queries if queries and hits is not None else None,
        "client_cached_prompt_share": (
            sum(r.cached_tokens for r in told) / sum(r.prompt_tokens for r in told)
            if told
            else None
        ),
        "mean_prompt_tokens": float(np.mean(prompts)) if prompts else None,
        "max_tokens": settings.max_tokens,
        "preemptions": delta(before, after, "vllm:num_preemptions_total"),
        "metrics_unavailable": metrics_note or None,
        "llamacpp_counters": other_counters(before, after) or None,
        "warm_round": warm_round,
    }


def stop_server(proc: subprocess.Popen) -> None:
    """Ctrl-C, as a user stops `kvscope serve` (it finishes its step); killed after 60 s."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


_stop_server = stop_server  # the soak bench's name for it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_free_port = free_port  # the soak bench's name for it


def server_command(args: argparse.Namespace, port: int, clients: int) -> list[str]:
    """`kvscope serve` with the bench's engine flags, every client fitting in one batch."""
    from kvscope.app.core.engine_flags import engine_knobs

    cmd = python_module_command(
        "kvscope.app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)
    )
    for f in engine_knobs():
        value = getattr(args, f.name)
        if f.name == "max_num_seqs":  # the scheduler batches at most this many
            value = max(value, clients)
        if value is not None and value != f.default:
            cmd += ["--" + f.name.replace("_", "-"), str(value)]
    return cmd


def served_model(host: str, port: int, api_key: str | None = None, timeout_s: float = 5) -> str:
    """The first model GET /v1/models lists: the name requests must carry."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        conn.request("GET", "/v1/models", headers=headers)
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise http.client.HTTPException(f"GET /v1/models answered HTTP {resp.status}")
    return json.loads(body)["data"][0]["id"]


def wait_until_up(
    proc: subprocess.Popen, port: int, timeout_s: float, name: str = "`kvscope serve`"
) -> str:
    """The served model's name once /v1/models answers (llama-server answers 503 while loading)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with status {proc.returncode}")
        try:
            return served_model("127.0.0.1", port)
        except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError):
            time.sleep(0.5)
    raise RuntimeError(f"{name} did not answer on port {port} in {timeout_s:.0f} s")


_wait_until_up = wait_until_up  # the soak bench's names for these
_scrape = scrape


def parse_target(url: str) -> tuple[str, int]:
    """`http://host:port` (a trailing /v1 or / is allowed) -> (host, port)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"--target must be an http://host:port URL, got {url!r}")
    if parts.path.rstrip("/") not in ("", "/v1"):
        raise ValueError(f"--target takes the server's base URL (no path but /v1), got {url!r}")
    try:
        port = parts.port or 80
    except ValueError as e:
        raise ValueError(f"--target has a bad port: {url!r} ({e})") from None
    return parts.hostname, port


def settings_from_args(args: argparse.Namespace, clients: int) -> ServeBenchSettings:
    return ServeBenchSettings(
        clients=clients,
        requests=args.serve_requests,
        seconds=args.serve_seconds if args.serve_seconds is not None else 120.0,
        max_tokens=args.serve_max_tokens,
        out=Path(args.out),
    )


def run_serve_bench(args: argparse.Namespace) -> int:
    """`kvscope bench --serve`: `kvscope serve` in a process of its own on 127.0.0.1 (so the
    clients' threads do not compete with the engine for one interpreter), then the clients;
    with --target, the clients against that server instead (nothing started). (--peer-server
    goes to app/bench/serving/peer.py, which imports this module.)"""
    clients = 64 if args.clients is None else args.clients
    if isinstance(clients, list):
        raise SystemExit(f"--clients {clients}: a list of client counts needs --peer-server")
    settings = settings_from_args(args, clients)
    if getattr(args, "target", None):
        report = run_on_target(args.target, settings)
    else:
        report = run_on_our_server(args, settings)
    path = settings.out / "bench_serve.json"
    report["machine"] = machine_info() | {"cpu_model": cpu_model_name()}
    settings.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(summarize(report))
    print(f"  wrote {path}")
    return 0


def run_on_target(url: str, settings: ServeBenchSettings) -> dict:
    """The clients against a server already running at `url` (any OpenAI-compatible one)."""
    host, port = parse_target(url)
    api_key = os.environ.get("KVSCOPE_API_KEY")  # the key `kvscope serve` reads too
    model = served_model(host, port, api_key, timeout_s=30)
    report = run_load(host, port, model, settings, api_key)
    report["target"] = {"url": url, "model": model}
    return report


def run_on_our_server(args: argparse.Namespace, settings: ServeBenchSettings) -> dict:
    port = free_port()
    cmd = server_command(args, port, settings.clients)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    try:
        model = wait_until_up(proc, port, SERVER_START_TIMEOUT_S)
        report = run_load("127.0.0.1", port, model, settings)
        after = scrape("127.0.0.1", port, None)
        report["engine"] = {
            "server_command": " ".join(cmd[1:]),
            "kv_blocks_total": after.get("kvscope_kv_blocks_total"),
        }
    finally:
        stop_server(proc)
    return report


def summarize(report: dict) -> str:
    def ms(v):
        return "n/a" if v is None else f"{v * 1000:.0f} ms"

    rate = report["prefix_hit_rate"]
    where = f" against {report['target']['url']}" if report.get("target") else ""
    return "\n".join(
        [
            f"serve{where}: {report['clients']} clients, {report['requests_completed']}/"
            f"{report['requests_sent']} requests in {report['seconds']:.1f} s "
            f"({report['requests_lost']} lost, {report['requests_cut_at_time_bound']} cut at "
            f"the {report['time_bound_s']:.0f} s bound)",
            f"  {report['requests_per_s']:.2f} requests/s, "
            f"{report['output_tokens_per_s']:.1f} output tokens/s "
            f"(counted from {report['output_tokens_counted_from'] or 'nothing'})",
            f"  TTFT p50 {ms(report['ttft_p50_s'])}, p99 {ms(report['ttft_p99_s'])}; "
            f"ITL p50 {ms(report['itl_p50_s'])}, p99 {ms(report['itl_p99_s'])}",
            f"  prefix hit rate {'n/a' if rate is None else f'{rate:.1%}'}"
            + (f" ({report['metrics_unavailable']})" if report.get("metrics_unavailable") else ""),
        ]
    )
