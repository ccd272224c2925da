"""`kvscope bench --serve`: N concurrent streaming clients against `kvscope serve` on 127.0.0.1.

Agent-style traffic: every request carries the same long system prompt (the bundled workload's
agent prompt, ~1,400 tokens) and a question of its own. One uncounted request goes first and
caches that prompt, as an agent's first call would; the concurrent ones then share it.
The server runs as `kvscope serve` in a process of its own; each client is a thread with a plain
HTTP/1.1 connection (the stdlib, no extra client library), reading the SSE stream as it arrives.
Bounded by a request count and a wall-clock limit: no new request starts after the limit, and
the streams still open then are cut and counted apart from lost ones (errors, broken streams).

Reports requests/s, time to first token and inter-token latency (p50/p99, as the client sees
them: first content chunk, gaps between content chunks), prefix-cache hit rate (from the
server's own vllm:prefix_cache_* counters) and how many requests were lost."""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from app.bench.machine import machine_info
from app.core.paths import ASSETS_DIR

REQUEST_TIMEOUT_S = 300.0
SERVER_START_TIMEOUT_S = 300.0  # loading the model on a busy machine
CUT = "cut at the time bound"


@dataclass
class ServeBenchSettings:
    clients: int = 64
    requests: int | None = None  # None: 2 per client
    seconds: float = 120.0
    max_tokens: int = 32
    system_chars: int | None = None  # cut the shared system prompt (tests, small contexts)
    out: Path = Path("bench_out")

    def __post_init__(self) -> None:
        if self.clients < 1:
            raise ValueError(f"clients must be >= 1, got {self.clients}")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if not self.seconds > 0:
            raise ValueError(f"seconds must be > 0, got {self.seconds}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def total_requests(self) -> int:
        return self.requests if self.requests is not None else 2 * self.clients


@dataclass
class RequestResult:
    ok: bool
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    cached_tokens: int = 0
    prompt_tokens: int = 0
    error: str | None = None


def agent_messages(k: int, system_chars: int | None = None) -> list[dict]:
    agent = json.loads((ASSETS_DIR / "chat_mixed.json").read_text())["agent"]
    questions = agent["questions"]
    question = f"{questions[k % len(questions)]} (request {k})"
    return [
        {"role": "system", "content": agent["system_prompt"][:system_chars]},
        {"role": "user", "content": question},
    ]


class OpenConnections:
    """The clients' live connections, so the time bound can cut the ones still streaming."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: set[http.client.HTTPConnection] = set()
        self.closed = False

    def add(self, conn: http.client.HTTPConnection) -> bool:
        with self._lock:
            if not self.closed:
                self._conns.add(conn)
            return not self.closed

    def discard(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._conns.discard(conn)

    def cut_all(self) -> None:
        with self._lock:
            self.closed = True
            for conn in self._conns:
                if conn.sock is not None:
                    try:
                        conn.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass


def stream_one(
    host,
    port,
    model,
    k: int,
    settings: ServeBenchSettings,
    api_key: str | None,
    conns: OpenConnections | None = None,
):
    """One streaming chat request; what the client saw of it."""
    max_tokens = settings.max_tokens
    body = json.dumps(
        {
            "model": model,
            "messages": agent_messages(k, settings.system_chars),
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": f"bench-{k % 8}",
        }
    )
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    conn = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT_S)
    result = RequestResult(ok=False)
    try:
        sent = time.perf_counter()
        conn.connect()
        if conns is not None and not conns.add(conn):
            result.error = CUT
            return result
        conn.request("POST", "/v1/chat/completions", body, headers)
        resp = conn.getresponse()
        if resp.status != 200:
            result.error = f"HTTP {resp.status}: {resp.read()[:200]!r}"
            return result
        last = None
        finished = done = False
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"]
                result.prompt_tokens = usage["prompt_tokens"]
                result.cached_tokens = usage["prompt_tokens_details"]["cached_tokens"]
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content"):
                    now = time.perf_counter()
                    if last is None:
                        result.ttft = now - sent
                    else:
                        result.gaps.append(now - last)
                    last = now
                    result.tokens += 1
                if choice.get("finish_reason"):
                    finished = True
        result.ok = done and finished
        if not result.ok:
            cut = conns is not None and conns.closed
            result.error = CUT if cut else "stream ended without a finish_reason and [DONE]"
    except (OSError, http.client.HTTPException, ValueError) as e:
        result.error = CUT if conns is not None and conns.closed else f"{type(e).__name__}: {e}"
    finally:
        if conns is not None:
            conns.discard(conn)
        conn.close()
    return result


def _scrape(host: str, port: int, api_key: str | None) -> dict[str, float]:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    conn.request("GET", "/metrics", headers=headers)
    text = conn.getresponse().read().decode()
    conn.close()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.labels.get("finished_reason"):
                values[sample.name] = sample.value
    return values


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def run_load(host, port, model, settings: ServeBenchSettings, api_key: str | None = None) -> dict:
    """Drive the server with `settings.clients` concurrent streams; the report (no files).

    One request goes first, alone and not counted, as an agent's first call does: it puts the
    shared system prompt in the prefix cache that the concurrent requests then share."""
    warm = stream_one(host, port, model, -1, settings, api_key)
    if not warm.ok:
        raise RuntimeError(f"the warm-up request failed: {warm.error}")
    before = _scrape(host, port, api_key)
    total = settings.total_requests
    next_k = iter(range(total))
    lock = threading.Lock()
    results: list[RequestResult] = []
    started = time.perf_counter()
    deadline = started + settings.seconds

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
    elapsed = time.perf_counter() - started
    time.sleep(0.5)  # let the server abort what was cut before reading its counters
    after = _scrape(host, port, api_key)
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    gaps = [g for r in ok for g in r.gaps]
    queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
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
        "ttft_p50_s": _pct(ttfts, 50),
        "ttft_p99_s": _pct(ttfts, 99),
        "itl_p50_s": _pct(gaps, 50),
        "itl_p99_s": _pct(gaps, 99),
        "prefix_hit_rate": hits / queries if queries else None,
        "client_cached_prompt_share": (
            sum(r.cached_tokens for r in ok) / max(1, sum(r.prompt_tokens for r in ok))
        ),
        "mean_prompt_tokens": float(np.mean([r.prompt_tokens for r in ok])) if ok else None,
        "max_tokens": settings.max_tokens,
        "preemptions": after["vllm:num_preemptions_total"] - before["vllm:num_preemptions_total"],
    }


def _stop_server(proc: subprocess.Popen) -> None:
    """Ctrl-C, as a user stops `kvscope serve` (it finishes its step); killed after 60 s."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(args: argparse.Namespace, port: int, clients: int) -> list[str]:
    """`kvscope serve` with the bench's engine flags, every client fitting in one batch."""
    from app.core.engine_flags import engine_knobs

    cmd = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    for f in engine_knobs():
        value = getattr(args, f.name)
        if f.name == "max_num_seqs":  # the scheduler batches at most this many
            value = max(value, clients)
        if value is not None and value != f.default:
            cmd += ["--" + f.name.replace("_", "-"), str(value)]
    return cmd


def _wait_until_up(proc: subprocess.Popen, port: int, timeout_s: float) -> str:
    """The served model's name once /v1/models answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"`kvscope serve` exited with status {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/v1/models")
            models = json.loads(conn.getresponse().read())
            conn.close()
            return models["data"][0]["id"]
        except (OSError, http.client.HTTPException, ValueError, KeyError):
            time.sleep(0.5)
    raise RuntimeError(f"`kvscope serve` did not answer on port {port} in {timeout_s:.0f} s")


def run_serve_bench(args: argparse.Namespace) -> int:
    """`kvscope bench --serve`: `kvscope serve` in a process of its own on 127.0.0.1 (so the
    clients' threads do not compete with the engine for one interpreter), then the clients."""
    settings = ServeBenchSettings(
        clients=args.clients,
        requests=args.serve_requests,
        seconds=args.serve_seconds,
        max_tokens=args.serve_max_tokens,
        out=Path(args.out),
    )
    port = _free_port()
    cmd = server_command(args, port, settings.clients)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    try:
        model = _wait_until_up(proc, port, SERVER_START_TIMEOUT_S)
        report = run_load("127.0.0.1", port, model, settings)
        after = _scrape("127.0.0.1", port, None)
        report["engine"] = {
            "server_command": " ".join(cmd[1:]),
            "kv_blocks_total": after.get("kvscope_kv_blocks_total"),
        }
    finally:
        _stop_server(proc)
    report["machine"] = machine_info()
    settings.out.mkdir(parents=True, exist_ok=True)
    path = settings.out / "bench_serve.json"
    path.write_text(json.dumps(report, indent=2))
    print(summarize(report))
    print(f"  wrote {path}")
    return 0


def summarize(report: dict) -> str:
    def ms(v):
        return "n/a" if v is None else f"{v * 1000:.0f} ms"

    rate = report["prefix_hit_rate"]
    return "\n".join(
        [
            f"serve: {report['clients']} clients, {report['requests_completed']}/"
            f"{report['requests_sent']} requests in {report['seconds']:.1f} s "
            f"({report['requests_lost']} lost, {report['requests_cut_at_time_bound']} cut at "
            f"the {report['time_bound_s']:.0f} s bound)",
            f"  {report['requests_per_s']:.2f} requests/s, "
            f"{report['output_tokens_per_s']:.1f} output tokens/s",
            f"  TTFT p50 {ms(report['ttft_p50_s'])}, p99 {ms(report['ttft_p99_s'])}; "
            f"ITL p50 {ms(report['itl_p50_s'])}, p99 {ms(report['itl_p99_s'])}",
            f"  prefix hit rate {'n/a' if rate is None else f'{rate:.1%}'}",
        ]
    )
