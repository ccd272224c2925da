"""The serve bench against servers that are not ours (`--target`, `--peer-server llama.cpp`):
the client against a plain OpenAI-style SSE server without vLLM's metrics, the report's table,
llama-server's command line, and llama-server itself where its binary is built."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvscope.app.bench.llama_cpp.server import (
    BUILD_HINT,
    LlamaServerMissing,
    LlamaServerSpec,
    find_llama_server,
    slot_context,
    start_logged,
)
from kvscope.app.bench.serving.bench import (
    ServeBenchSettings,
    parse_target,
    run_load,
    run_on_target,
    stop_server,
    wait_until_up,
)
from kvscope.app.bench.serving.peer import cell_order, died_why
from kvscope.app.bench.serving.peer_report import markdown_table, plot_serve_peer
from kvscope.app.cli.main import build_parser


class _OpenAIish(BaseHTTPRequestHandler):
    """Streams chat completions as llama-server does: a role chunk with null content, content
    chunks (one of them two tokens), a finish chunk, then usage in a chunk of its own. No
    /metrics (404). `usage=False` on the server: no usage chunk at all."""

    protocol_version = "HTTP/1.0"  # the stream ends when the connection closes

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        else:
            self.send_error(404, "no such endpoint")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        pieces = ["Hel", "lo th", "ere"]  # the second piece stands for two tokens
        chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]}]
        chunks += [{"choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces]
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        if self.server.usage:
            usage = {"prompt_tokens": 100, "completion_tokens": 4, "total_tokens": 104}
            usage["prompt_tokens_details"] = {"cached_tokens": 80}
            chunks.append({"choices": [], "usage": usage})
        self.wfile.write(b": ping\n\n")  # an SSE comment, as llama-server's keep-alive
        for chunk in chunks:
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def _json(self, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(params=[True, False], ids=["usage", "no-usage"])
def fake_server(request):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OpenAIish)
    server.daemon_threads = True
    server.bodies, server.usage = [], request.param
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_run_load_on_a_server_without_vllm_metrics(fake_server):
    settings = ServeBenchSettings(clients=2, requests=4, seconds=30, max_tokens=4, warm_round_s=30)
    report = run_on_target(f"http://127.0.0.1:{fake_server.server_address[1]}/v1", settings)
    assert report["target"]["model"] == "fake-model"  # from /v1/models
    assert report["requests_completed"] == 4 and report["requests_lost"] == 0, report["errors"]
    # Absent vLLM counters are None, not a KeyError, and the report says why.
    assert report["prefix_hit_rate"] is None and report["preemptions"] is None
    assert "HTTP 404" in report["metrics_unavailable"]
    assert report["ttft_p50_s"] > 0 and report["itl_p50_s"] > 0
    if fake_server.usage:  # 4 tokens in 3 chunks: the usage counts them
        assert report["output_tokens_counted_from"] == "usage"
        assert report["mean_output_tokens"] == 4
        assert report["client_cached_prompt_share"] == pytest.approx(0.8)
        assert report["mean_prompt_tokens"] == 100
    else:
        assert report["output_tokens_counted_from"] == "stream chunks"
        assert report["mean_output_tokens"] == 3
        assert report["client_cached_prompt_share"] is None
        assert report["mean_prompt_tokens"] is None
    # The warm-up request, then a warm round of one request per client, uncounted.
    assert report["warm_round"]["requests"] == report["warm_round"]["completed"] == 2
    # Every request (the warm ones too) asks for max_tokens past EOS, with usage, streamed.
    assert len(fake_server.bodies) == 1 + 2 + 4
    for body in fake_server.bodies:
        assert body["model"] == "fake-model" and body["max_tokens"] == 4
        assert body["ignore_eos"] is True and body["stream_options"] == {"include_usage": True}
        assert body["messages"][0]["role"] == "system"


def test_parse_target_names_a_bad_url():
    assert parse_target("http://127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_target("http://localhost:9000/v1/") == ("localhost", 9000)
    for bad in ("https://127.0.0.1:8080", "127.0.0.1:8080", "http://127.0.0.1:8080/api"):
        with pytest.raises(ValueError, match="--target") as e:
            parse_target(bad)
        assert bad in str(e.value)


def test_cli_client_lists_and_peer_flags():
    parse = build_parser().parse_args
    args = parse(["bench", "--serve", "--peer-server", "llama.cpp", "--clients", "1,8,32"])
    assert (args.peer_server, args.clients) == ("llama.cpp", [1, 8, 32])
    assert parse(["bench", "--serve", "--clients", "4"]).clients == 4
    assert parse(["bench", "--serve", "--target", "http://127.0.0.1:1"]).target
    for bad in ("0", "1,x"):
        with pytest.raises(SystemExit):
            parse(["bench", "--serve", "--clients", bad])


def test_cells_alternate_and_ours_goes_first():
    assert cell_order([1, 8, 32]) == [
        ("kvscope", 1),
        ("llama.cpp", 1),
        ("llama.cpp", 8),
        ("kvscope", 8),
        ("kvscope", 32),
        ("llama.cpp", 32),
    ]


def test_llama_server_command(tmp_path):
    assert slot_context(1450, 32) == 1792  # 1450 + 32 + 64 rounded up to 256
    spec = LlamaServerSpec(Path("/x/llama-server"), Path("/m/model.gguf"), threads=3, slot_ctx=1792)
    cmd = spec.command(8123)

    def flag(name: str) -> str:
        return cmd[cmd.index(name) + 1]

    assert cmd[0] == "/x/llama-server" and flag("-m") == "/m/model.gguf"
    assert (flag("--host"), flag("--port")) == ("127.0.0.1", "8123")
    assert flag("-t") == flag("-tb") == "3"  # ours' threads, generation and prompts alike
    assert flag("-np") == "8" and flag("-c") == str(8 * 1792) == str(spec.ctx)  # -c is split
    assert {"-cb", "--metrics", "--no-webui"} <= set(cmd)
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        LlamaServerSpec(Path("x"), Path("m"), threads=0, slot_ctx=1792)
    with pytest.raises(LlamaServerMissing) as e:
        find_llama_server(tmp_path / "absent")
    assert str(tmp_path / "absent") in str(e.value) and BUILD_HINT in str(e.value)
    assert "illegal instruction" in died_why(-4) and died_why(1) == ""


def _canned_report() -> dict:
    def cell(server, clients, tok_s, ttft):
        return {
            "server": server,
            "clients": clients,
            "requests_per_s": tok_s / 32,
            "output_tokens_per_s": tok_s,
            "ttft_p50_s": ttft,
            "ttft_p99_s": 2 * ttft,
            "itl_p50_s": 0.02,
            "itl_p99_s": None,
            "requests_completed": 16,
            "requests_sent": 17,
            "requests_lost": 0,
            "mean_prompt_tokens": 1402.0,
            "output_tokens_counted_from": "usage",
            "warm_round": {"requests": clients, "completed": clients, "seconds": 2.5 * clients},
        }

    return {
        "machine": {"cpu_model": "Intel(R) Xeon(R) Test CPU", "cpu_count": 2},
        "model": "/m/SmolLM2-135M-Instruct.Q4_1.gguf",
        "threads": 1,
        "clients": [1, 8],
        "max_tokens": 32,
        "seconds_per_cell": 60.0,
        "order": ["kvscope@1", "llama.cpp@1", "llama.cpp@8", "kvscope@8"],
        "llama_server": {
            "version": "version: 0.5.0-dev",
            "slots": 8,
            "ctx_note": "-c 14336 is split across the 8 slots: 1792 tokens each",
        },
        "cells": [
            cell("kvscope", 1, 40.0, 0.125),
            cell("llama.cpp", 1, 50.0, 0.1),
            cell("llama.cpp", 8, 80.0, 0.5),
            cell("kvscope", 8, 100.0, 0.4),
        ],
    }


def test_markdown_table_from_a_canned_report(tmp_path):
    report = _canned_report()
    text = markdown_table(report)
    header, table = text.split("\n\n")
    assert "Intel(R) Xeon(R) Test CPU" in header and "SmolLM2-135M-Instruct.Q4_1.gguf" in header
    assert "1792 tokens each" in header and "1402 prompt tokens" in header
    rows = table.splitlines()
    assert rows[0].startswith("| clients | server | requests/s | output tok/s | vs llama-server")
    assert len(rows) == 2 + 4  # header, rule, then per count ours and llama-server
    assert rows[2] == (
        "| 1 | KVScope | 1.25 | 40.0 | x0.80 | 125 ms | 250 ms | 20 ms | n/a | 16/17 | 0 "
        "| 1/1 in 2.5 s |"
    )
    assert rows[3].startswith("| 1 | llama-server | 1.56 | 50.0 |  | 100 ms |")
    assert rows[4].startswith("| 8 | KVScope | 3.12 | 100.0 | x1.25 | 400 ms |")
    plot_serve_peer(report, tmp_path / "serve_peer.png")
    assert (tmp_path / "serve_peer.png").stat().st_size > 10_000


def _llama_server_or_skip() -> Path:
    try:
        return find_llama_server()
    except LlamaServerMissing as e:
        pytest.skip(str(e))


def test_llama_server_on_the_bundled_model(tmp_path):
    """The real llama-server (where `make peer` built it): the client reads its stream, its
    usage and its own counters; ignore_eos makes every reply max_tokens long."""
    from kvscope.app.bench.serving.bench import free_port
    from kvscope.engine.model.loader import default_model_path

    binary = _llama_server_or_skip()
    spec = LlamaServerSpec(binary, default_model_path(), threads=1, slot_ctx=512, slots=2)
    port = free_port()
    log = tmp_path / "llama-server.log"
    proc = start_logged(spec.command(port), log)
    try:
        try:
            model = wait_until_up(proc, port, 60, "llama-server")
        except RuntimeError as e:
            pytest.fail(f"{e}{died_why(proc.returncode)}:\n{log.read_text()[-1500:]}")
        # One client: each request lands on the slot that holds the warm-up's prompt.
        settings = ServeBenchSettings(
            clients=1, requests=2, seconds=60, max_tokens=5, system_chars=400
        )
        report = run_load("127.0.0.1", port, model, settings)
    finally:
        stop_server(proc)
    assert report["requests_completed"] == 2 and report["requests_lost"] == 0, report["errors"]
    assert report["output_tokens_counted_from"] == "usage" and report["mean_output_tokens"] == 5
    assert report["prefix_hit_rate"] is None  # no vLLM counters there ...
    assert report["llamacpp_counters"]["llamacpp:tokens_predicted_total"] >= 10  # ... its own
    assert report["client_cached_prompt_share"] > 0.5  # the shared system prompt, reused
