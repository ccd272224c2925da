"""`kvscope bench --serve --peer-server llama.cpp`: `kvscope serve` and llama.cpp's `llama-server`
on the same GGUF with the same threads, driven by the same client (app/bench/serving/stream.py) at
each of `--clients 1,8,32` concurrent clients.

One server runs at a time (on a 2-core machine two loaded servers would measure each other),
and the order alternates per client count (ours, llama.cpp; llama.cpp, ours; ...), so a server
that runs twice in a row is not restarted and a neighbour's load drifting over the run falls on
both alike. Each server starts once per run of cells with the same configuration (ours with room
to batch the largest client count, llama-server with -np 8). Every cell is bounded by a request
count and a time bound (`--serve-requests`, `--serve-seconds`); run_load's uncounted warm-up
request caches the shared system prompt on each server before a cell is timed.

llama-server's -c is computed from the longest prompt as our server tokenizes it (POST
/tokenize, the same GGUF's template and tokenizer) plus the reply, times the slots; so the first
cell is always ours. Before each cell, after run_load's one warm-up request, a warm round of as
many uncounted requests as the cell has clients, all at once: llama-server caches prompts per
slot (a new slot starts cold and prefills the whole shared prompt), ours across requests, and a
cell is meant to time each in its steady state, not llama-server's first minute. The warm
round's duration is in the report and the table (it shows that cold start).

Writes bench_serve_peer.json, bench_serve_peer.png and prints a markdown table
(app/bench/serving/peer_report.py)."""

from __future__ import annotations

import argparse
import copy
import http.client
import json
import signal
import subprocess
import time
from pathlib import Path

from kvscope.app.bench.cpu_model import cpu_model_name
from kvscope.app.bench.llama_cpp.server import (
    LlamaServerMissing,
    LlamaServerSpec,
    find_llama_server,
    llama_server_version,
    log_tail,
    slot_context,
    start_logged,
)
from kvscope.app.bench.machine import ContentionMeter, machine_info
from kvscope.app.bench.serving.bench import (
    SERVER_START_TIMEOUT_S,
    ServeBenchSettings,
    free_port,
    run_load,
    server_command,
    stop_server,
    wait_until_up,
)
from kvscope.app.bench.serving.peer_report import markdown_table, plot_serve_peer
from kvscope.app.bench.serving.stream import agent_messages
from kvscope.app.core.paths import ASSETS_DIR

OURS, PEER = "kvscope", "llama.cpp"
DEFAULT_CLIENTS = (1, 8, 32)
DEFAULT_CELL_SECONDS = 60.0
# The warm round's bound: cold llama-server slots prefill the shared prompt one slot each
# (about 10k tokens for 8 slots of this prompt), minutes for a 1B model on two cores.
WARM_ROUND_S = 900.0


def cell_requests(clients: int, given: int | None) -> int:
    """Requests a cell may send: `given`, else 4 per client and at least 16."""
    return given if given is not None else max(16, 4 * clients)


def cell_order(counts: list[int]) -> list[tuple[str, int]]:
    """(server, clients) in run order: ours first, then alternating per count (ABBA...)."""
    order = []
    for i, n in enumerate(counts):
        pair = (OURS, PEER) if i % 2 == 0 else (PEER, OURS)
        order += [(name, n) for name in pair]
    return order


def longest_prompt_tokens(port: int, model: str, ks: range, system_chars: int | None) -> int:
    """The most tokens any request's messages make, as our server templates and tokenizes them
    (one POST /tokenize per distinct question; the largest request number for the suffix)."""
    questions = len(json.loads((ASSETS_DIR / "chat_mixed.json").read_text())["agent"]["questions"])
    longest = 0
    for k in range(min(questions, len(ks))):
        top = max(j for j in ks if j % questions == k % questions)
        body = json.dumps({"model": model, "messages": agent_messages(top, system_chars)})
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            conn.request("POST", "/tokenize", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            answer = resp.read()
        finally:
            conn.close()
        if resp.status != 200:
            raise RuntimeError(f"POST /tokenize answered HTTP {resp.status}: {answer[:200]!r}")
        longest = max(longest, json.loads(answer)["count"])
    return longest


def died_why(returncode: int | None) -> str:
    """What a server's exit status says, where it says more than the number."""
    if returncode == -signal.SIGILL:
        return (
            " (an illegal instruction: its build uses an instruction set this CPU refuses, e.g."
            " AMX in a VM that does not pass AMX through; build it without that one)"
        )
    return ""


class ServerTurns:
    """The one server running now: started when a cell needs it, stopped when the next cell
    needs the other one (never both loaded), each with its output in a log file."""

    def __init__(self, commands: dict, out: Path) -> None:
        self.commands = commands  # name -> callable(port) -> argv
        self.out = out
        self.name: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.model = ""
        self.starts: dict[str, int] = {}

    def use(self, name: str) -> tuple[int, str]:
        if name != self.name:
            self.stop()
            self.port = free_port()
            log = self.log(name)
            self.proc = start_logged(self.commands[name](self.port), log)
            self.name = name
            self.starts[name] = self.starts.get(name, 0) + 1
            try:
                self.model = wait_until_up(self.proc, self.port, SERVER_START_TIMEOUT_S, name)
            except RuntimeError as e:
                why = died_why(self.proc.returncode)
                raise RuntimeError(f"{e}{why}; the end of {log}:\n{log_tail(log)}") from None
        return self.port, self.model

    def log(self, name: str) -> Path:
        return self.out / f"serve_peer_{name}.log"

    def stop(self) -> None:
        if self.proc is not None:
            stop_server(self.proc)
        self.proc, self.name = None, None


def run_serve_peer(args: argparse.Namespace) -> int:
    """CLI entry (`kvscope bench --serve --peer-server llama.cpp`): 2 when llama-server is
    missing (the message says how to build it)."""
    from kvscope.engine.cpu_threads import default_num_threads
    from kvscope.engine.model.loader import default_model_path

    try:
        binary = find_llama_server(getattr(args, "llama_server", None))
    except LlamaServerMissing as e:
        print(f"error: {e}")
        return 2
    counts = args.clients if isinstance(args.clients, list) else None
    if counts is None:
        counts = list(DEFAULT_CLIENTS) if args.clients is None else [args.clients]
    ours_args = copy.copy(args)
    ours_args.num_threads = args.num_threads or default_num_threads()  # both get this many
    report = serve_peer(
        ours_args,
        gguf=Path(args.model) if args.model else default_model_path(),
        binary=binary,
        counts=counts,
        seconds=args.serve_seconds or DEFAULT_CELL_SECONDS,
        out=Path(args.out),
    )
    print(markdown_table(report))
    print(f"  wrote {Path(args.out) / 'bench_serve_peer.json'} and bench_serve_peer.png")
    return 0


def serve_peer(
    args: argparse.Namespace,
    gguf: Path,
    binary: Path,
    counts: list[int],
    seconds: float,
    out: Path,
) -> dict:
    """Run every cell; write the JSON and the PNG; the report. `args` carries ours' engine
    flags, with num_threads set (llama-server gets the same)."""
    if not counts or any(n < 1 for n in counts):
        raise ValueError(f"client counts must be >= 1, got {counts}")
    threads = args.num_threads
    args = copy.copy(args)
    args.model = str(gguf)
    started = time.perf_counter()
    settings = {
        n: ServeBenchSettings(
            clients=n,
            requests=cell_requests(n, args.serve_requests),
            seconds=seconds,
            max_tokens=args.serve_max_tokens,
            out=out,
            warm_round_s=WARM_ROUND_S,
        )
        for n in counts
    }
    most = max(s.total_requests for s in settings.values())
    spec: dict[str, LlamaServerSpec] = {}

    def peer_command(port: int) -> list[str]:
        return spec[PEER].command(port)

    ours_cmd = server_command(args, 0, max(counts))
    turns = ServerTurns(
        {OURS: lambda port: server_command(args, port, max(counts)), PEER: peer_command}, out
    )
    meter = ContentionMeter()
    cells = []
    longest = 0
    try:
        for name, n in cell_order(counts):  # ours first: llama-server's -c needs `longest`
            port, model = turns.use(name)
            if PEER not in spec:
                longest = longest_prompt_tokens(port, model, range(-1, most), None)
                slot = slot_context(longest, args.serve_max_tokens)
                spec[PEER] = LlamaServerSpec(binary, gguf, threads, slot)
            with meter.phase(f"{name}_{n}"):
                cell = run_load("127.0.0.1", port, model, settings[n])
            cells.append({"server": name, "clients": n, "model_name": model} | cell)
            print(f"  {name} at {n} clients: {cell['output_tokens_per_s']:.1f} output tok/s")
    finally:
        turns.stop()
    peer = spec[PEER]
    report = {
        "machine": machine_info()
        | {"cpu_model": cpu_model_name(), "cpu_stall_share": meter.stall_share},
        "model": str(gguf),
        "threads": threads,
        "clients": counts,
        "max_tokens": args.serve_max_tokens,
        "seconds_per_cell": seconds,
        "requests_per_cell": {str(n): s.total_requests for n, s in settings.items()},
        "order": [f"{name}@{n}" for name, n in cell_order(counts)],
        "server_starts": turns.starts,
        "kvscope": {"command": " ".join(ours_cmd[1:]).replace("--port 0", "--port PORT")},
        "llama_server": {
            "binary": str(binary),
            "version": llama_server_version(binary),
            "command": " ".join(peer.command(0)[1:]).replace("--port 0", "--port PORT"),
            "slots": peer.slots,
            "ctx": peer.ctx,
            "ctx_per_slot": peer.slot_ctx,
            "ctx_note": f"-c {peer.ctx} is split across the {peer.slots} slots: "
            f"{peer.slot_ctx} tokens each (longest prompt {longest} + {args.serve_max_tokens} "
            "reply tokens + margin)",
        },
        "cells": cells,
        "runtime_s": time.perf_counter() - started,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_serve_peer.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_serve_peer(report, out / "bench_serve_peer.png")
    return report
