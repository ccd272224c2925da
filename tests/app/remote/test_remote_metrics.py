"""/metrics text into RemoteMetrics: ours (app/serve/metrics.py, vLLM's names) and an older
vLLM's names; rates between two scrapes; the poller when the server is not there."""

from __future__ import annotations

import threading
import time

import pytest
from remote_fakes import free_endpoint, wait_until

from kvscope.app.remote.connection import parse_connection
from kvscope.app.remote.metrics_scrape import MetricsDelta, MetricsParseError, parse_metrics
from kvscope.app.remote.monitor import ReplicaMonitor
from kvscope.app.serve.metrics import ServerMetrics

# As vLLM 0.7-0.8 exposed them (hand-written): gpu_* names, time_per_output_token, two engines.
OLD_VLLM = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="2048",\
prefix_caching_hash_algo="sha256_cbor"} 1.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="Qwen/Qwen2.5-7B"} 0.25
vllm:gpu_cache_usage_perc{engine="1",model_name="Qwen/Qwen2.5-7B"} 0.75
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5-7B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen2.5-7B"} 2.0
# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen2.5-7B"} 1000.0
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen2.5-7B"} 250.0
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.01",model_name="Qwen/Qwen2.5-7B"} 2.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.1",model_name="Qwen/Qwen2.5-7B"} 9.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen2.5-7B"} 10.0
vllm:time_per_output_token_seconds_sum{engine="0",model_name="Qwen/Qwen2.5-7B"} 0.5
vllm:time_per_output_token_seconds_count{engine="0",model_name="Qwen/Qwen2.5-7B"} 10.0
"""


def test_our_servers_metrics_under_vllm_names():
    m = ServerMetrics("tiny-model", max_model_len=256)
    m.kv_usage.set(0.5)
    m.running.set(2)
    m.waiting.set(1)
    m.preemptions.inc(3)
    m.prefix_queries.inc(64)
    m.prefix_hits.inc(16)
    m.requests.generation_tokens.inc(40)
    m.requests.prompt_tokens.inc(64)
    for t in (0.02, 0.2):
        m.requests.ttft.observe(t)
    m.requests.itl.observe(0.05)
    m.pool["kv_blocks_total"].set(128)
    got = parse_metrics(m.render().decode(), now=10.0)
    assert got.model == "tiny-model" and got.scraped_at == 10.0
    assert (got.kv_cache_usage, got.running, got.waiting, got.preemptions_total) == (0.5, 2, 1, 3)
    assert (got.prefix_queries_total, got.prefix_hits_total) == (64, 16)
    assert got.prefix_hit_rate == 0.25
    assert (got.generation_tokens_total, got.prompt_tokens_total) == (40, 64)
    assert got.ttft.count == 2 and got.ttft.sum == pytest.approx(0.22)
    assert got.ttft.mean == pytest.approx(0.11)
    assert got.ttft.quantile(0.5) == 0.02 and got.ttft.quantile(1.0) == 0.25
    assert got.itl.count == 1 and got.e2e.count == 0
    assert got.kvscope["kv_blocks_total"] == 128
    assert "vllm:num_requests_running" in got.names


def test_older_vllm_names_and_two_engines():
    got = parse_metrics(OLD_VLLM, now=0.0)
    assert got.model == "Qwen/Qwen2.5-7B"
    assert got.kv_cache_usage == 0.5  # the mean over both engines
    assert got.running == 5  # summed
    assert (got.prefix_queries_total, got.prefix_hits_total) == (1000, 250)
    assert got.itl.count == 10 and got.itl.mean == pytest.approx(0.05)
    assert got.itl.quantile(0.5) == 0.1
    assert got.block_size == 16 and got.num_gpu_blocks == 2048
    assert got.hash_algo == "sha256_cbor"
    assert got.ttft is None and got.waiting is None and got.kvscope == {}


def test_rates_between_scrapes_and_a_counter_reset():
    m = ServerMetrics("m", max_model_len=256)
    m.prefix_queries.inc(100)
    m.prefix_hits.inc(10)
    m.requests.generation_tokens.inc(50)
    m.requests.ttft.observe(1.0)
    first = parse_metrics(m.render().decode(), now=100.0)
    m.prefix_queries.inc(100)
    m.prefix_hits.inc(90)
    m.requests.generation_tokens.inc(20)
    m.requests.ttft.observe(0.2)
    m.requests.ttft.observe(0.4)
    second = parse_metrics(m.render().decode(), now=102.0)
    d = MetricsDelta(first, second)
    assert d.interval_s == 2.0
    assert d.prefix_hit_rate == pytest.approx(0.9)  # this interval's, not the lifetime 0.5
    assert d.generation_tokens_per_s == pytest.approx(10.0)
    assert d.ttft_mean == pytest.approx(0.3)
    assert d.itl_mean is None  # no new observations
    assert d.preemptions == 0 and not d.reset
    # The server restarted: its counters start again.
    fresh = ServerMetrics("m", max_model_len=256)
    fresh.requests.generation_tokens.inc(6)
    third = parse_metrics(fresh.render().decode(), now=104.0)
    d = MetricsDelta(second, third)
    assert d.generation_tokens_per_s == pytest.approx(3.0) and d.reset


def test_unreadable_text_raises():
    with pytest.raises(MetricsParseError, match="not Prometheus text"):
        parse_metrics('vllm:x{model_name="a} 1 2 3\n')


def test_the_poller_reports_a_server_that_is_not_there():
    port = free_endpoint().rsplit(":", 1)[1]  # a port nothing listens on
    monitor = ReplicaMonitor(parse_connection(f"http://127.0.0.1:{port}"), poll_s=0.05).start()
    try:
        snap = wait_until(
            lambda: (s := monitor.snapshot()).http_state == "down" and s, what="http down"
        )
        assert "ConnectError" in snap.http_error
        assert snap.status is None  # no KV events endpoint configured
        assert snap.metrics is None and snap.cache.num_blocks == 0
        wait_until(lambda: monitor.snapshot().http_retry_at is not None, what="a retry time")
    finally:
        monitor.stop()
    assert not monitor._poller.is_alive()


def test_the_poller_sends_the_api_key(default_model):
    from kvscope.app.serve.server import Server
    from kvscope.engine import LLM

    llm = LLM(model=default_model, device="cpu", dtype="float32", num_kv_blocks=16)
    srv = Server(llm, port=0, api_key="sekret").start()
    with_key = ReplicaMonitor(parse_connection(srv.base_url, api_key="sekret"), poll_s=0.05)
    without = ReplicaMonitor(parse_connection(srv.base_url), poll_s=0.05)
    try:
        with_key.start(), without.start()
        up = wait_until(lambda: (s := with_key.snapshot()).http_state == "up" and s, what="up")
        assert up.models == (srv.model_name,) and up.model == srv.model_name
        assert up.metrics.block_size == llm.engine.config.block_size
        # The server's default --prefix-caching-hash-algo, published as vLLM names it.
        assert up.metrics.hash_algo == "sha256"
        down = wait_until(lambda: (s := without.snapshot()).http_state == "down" and s, what="401")
        assert down.http_error == f"HTTP 401 from {srv.base_url}/metrics"
    finally:
        with_key.stop(), without.stop()
        srv.stop()


def test_snapshots_reuse_the_cache_copy_until_it_changes():
    from kvscope.app.remote.kv_wire import BlockStored, EventBatch

    conn = parse_connection("http://127.0.0.1:9", kv_events=free_endpoint())
    monitor = ReplicaMonitor(conn)  # not started: the subscriber's callback is driven by hand
    first, second = monitor.snapshot(), monitor.snapshot()
    assert first.cache is second.cache and first.status.state == "connecting"
    monitor._on_batch(0, EventBatch(ts=0.0, events=[BlockStored([1], None, [5, 6], 2)]))
    third = monitor.snapshot()
    assert third.cache is not first.cache and third.cache.num_blocks == 1
    assert first.cache.num_blocks == 0 and third.block_size == 2


def test_a_hostile_metrics_page_is_refused_and_the_poller_recovers():
    """A server sending a huge or binary /metrics page is shown down, naming why, without the
    poller reading it all or dying; once the page is sane again the replica is up."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from kvscope.app.remote.monitor import MAX_METRICS_BYTES

    page = {"body": b"x" * (MAX_METRICS_BYTES + 1)}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = page["body"] if self.path == "/metrics" else b'{"data": []}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the poller stopped reading: what the test wants

        def log_message(self, *_args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    monitor = ReplicaMonitor(parse_connection(url), poll_s=0.05).start()
    try:
        snap = wait_until(lambda: (s := monitor.snapshot()).http_state == "down" and s)
        assert "over 8 MiB" in snap.http_error
        page["body"] = bytes(range(256)) * 64  # binary junk
        wait_until(lambda: "over 8 MiB" not in monitor.snapshot().http_error, timeout=40)
        assert monitor.snapshot().http_state == "down" and monitor._poller.is_alive()
        page["body"] = b'vllm:num_requests_running{model_name="m",engine="0"} 3.0\n'
        snap = wait_until(lambda: (s := monitor.snapshot()).http_state == "up" and s, timeout=40)
        assert snap.metrics.running == 3.0
    finally:
        monitor.stop()
        httpd.shutdown()


def test_a_trickling_metrics_page_is_cut_and_stop_is_prompt():
    """/metrics sent one byte a second never times out a read: the whole answer has a
    deadline, and stop() ends the poller mid-read."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from kvscope.app.remote.monitor import SCRAPE_DEADLINE_S

    class Trickle(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            try:
                for _ in range(120):
                    self.wfile.write(b"#")
                    self.wfile.flush()
                    time.sleep(1.0)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *_args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    monitor = ReplicaMonitor(parse_connection(url), poll_s=0.05).start()
    try:
        snap = wait_until(
            lambda: (s := monitor.snapshot()).http_state == "down" and s,
            timeout=SCRAPE_DEADLINE_S + 10,
            what="the deadline",
        )
        assert f"took over {SCRAPE_DEADLINE_S:g} s" in snap.http_error
        time.sleep(1.5)  # mid-read again (the poller retries)
        began = time.monotonic()
        monitor.stop(timeout=3)
        assert not monitor._poller.is_alive() and time.monotonic() - began < 3
    finally:
        httpd.shutdown()
