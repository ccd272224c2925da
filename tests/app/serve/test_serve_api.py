"""`kvscope serve` through the real `openai` client and raw HTTP: chat and completions (whole and
streamed, n=2, logprobs, seeds, stops, cached prompt tokens), an abort by closing the stream
that frees the request's blocks, vLLM-named metrics read by prometheus_client's parser, and
OpenAI error bodies after which the server goes on serving."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from served import start_server

from kvscope.app.bench.serving.bench import ServeBenchSettings, run_load

KEY = "test-key"
MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def server(default_model):
    srv = start_server(default_model, 96, MAX_MODEL_LEN, api_key=KEY)
    # Every request id the engine sees, to check the client labels the map colours by.
    seen: list[str] = []

    def listen(event):
        if event.kind == "sequence_added":
            seen.append(event.request_id)

    srv.driver.call(lambda e: e.subscribe_kv_events(listen)).result()
    srv.request_ids = seen
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0, timeout=120)


def _stats(server) -> dict:
    return server.driver.call(lambda e: e.stats()).result(timeout=60)


def _metrics(server) -> dict:
    """Metric family name -> {(labels...): value} from /metrics, parsed as Prometheus does."""
    text = _get(server, "/metrics").decode()
    families = {}
    for family in text_string_to_metric_families(text):
        families[family.name] = family
    return families


def _value(families, family, sample_name=None, **labels) -> float:
    for sample in families[family].samples:
        if (sample_name is None or sample.name == sample_name) and all(
            sample.labels.get(k) == v for k, v in labels.items()
        ):
            return sample.value
    raise KeyError(f"{family} {sample_name} {labels}")


def _get(server, path: str, key: str | None = KEY) -> bytes:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(server.base_url + path, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read()


def _post(server, path: str, body: bytes, key: str | None = KEY) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(server.base_url + path, body, headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _announce_huge_body(server, path: str) -> tuple[int, dict]:
    """Headers announcing a 64 MiB body; the server must refuse before reading any of it."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.putrequest("POST", path)
    conn.putheader("Authorization", f"Bearer {KEY}")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(64 << 20))
    conn.endheaders()
    response = conn.getresponse()
    try:
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def _chat(server, content="Hi", **extra) -> dict:
    return {
        "model": server.model_name,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 3,
        **extra,
    }


def test_models_lists_the_served_model(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [server.model_name]


def test_chat_n2_with_logprobs_and_usage(client, server):
    r = client.chat.completions.create(
        model=server.model_name,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=4,
        n=2,
        seed=7,
        logprobs=True,
        top_logprobs=3,
        user="editor",
    )
    assert [c.index for c in r.choices] == [0, 1]
    for choice in r.choices:
        assert choice.finish_reason in ("stop", "length")
        tokens = choice.logprobs.content
        assert 1 <= len(tokens) <= 4
        assert "".join(t.token for t in tokens) == choice.message.content
        for t in tokens:
            assert len(t.top_logprobs) == 3
            assert t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob
            assert t.logprob <= 0
    completion = sum(len(c.logprobs.content) for c in r.choices)
    assert r.usage.completion_tokens == completion
    assert r.usage.total_tokens == r.usage.prompt_tokens + completion
    # Served requests carry the client's label, the group the block map colours by.
    assert any(rid.startswith("api-editor/") for rid in server.request_ids)


def test_stream_matches_the_whole_response_and_ends_with_usage(client, server):
    args = dict(
        model=server.model_name,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=5,
        temperature=0,
    )
    whole = client.chat.completions.create(**args)
    chunks = list(
        client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == whole.choices[0].finish_reason and not any(reasons[:-1])
    assert (
        chunks[-1].choices == []
        and chunks[-1].usage.completion_tokens == 5
        or (chunks[-1].usage.completion_tokens == whole.usage.completion_tokens)
    )
    # The same prompt again: its full blocks come from the prefix cache.
    assert whole.usage.prompt_tokens_details.cached_tokens >= 0
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 16


def test_completions_logprobs_seed_and_stop(client, server):
    a = client.completions.create(
        model=server.model_name, prompt="Once upon a time", max_tokens=4, logprobs=2, seed=3
    )
    b = client.completions.create(
        model=server.model_name, prompt="Once upon a time", max_tokens=4, logprobs=2, seed=3
    )
    assert a.choices[0].text == b.choices[0].text  # seeded sampling repeats
    lp = a.choices[0].logprobs
    assert "".join(lp.tokens) == a.choices[0].text
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs)
    assert all(len(top) <= 2 for top in lp.top_logprobs)
    assert lp.text_offset[0] == 0
    greedy = client.completions.create(
        model=server.model_name, prompt="The capital of France is", max_tokens=6, temperature=0
    )
    first_word = greedy.choices[0].text.split()[0]
    stopped = client.completions.create(
        model=server.model_name,
        prompt="The capital of France is",
        max_tokens=6,
        temperature=0,
        stop=[first_word],
    )
    assert first_word not in stopped.choices[0].text
    assert stopped.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model=server.model_name,
        prompt="The capital of France is",
        max_tokens=6,
        temperature=0,
        stream=True,
    )
    assert "".join(c.choices[0].text for c in streamed) == greedy.choices[0].text


def test_closing_a_stream_aborts_it_and_frees_its_blocks(client, server):
    before = _metrics(server)
    aborted_before = _value(
        before, "vllm:request_success", "vllm:request_success_total", finished_reason="abort"
    )
    stream = client.chat.completions.create(
        model=server.model_name,
        messages=[{"role": "user", "content": "Write a very long story about a dragon."}],
        max_tokens=200,
        temperature=0.8,
        stream=True,
    )
    got = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            got += 1
            if got == 2:
                break
    assert _stats(server)["kv_blocks_used"] > 0  # still generating
    stream.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        families = _metrics(server)
        used = _value(families, "kvscope_kv_blocks_used")
        aborted = _value(
            families, "vllm:request_success", "vllm:request_success_total", finished_reason="abort"
        )
        if used == 0 and aborted == aborted_before + 1:
            break
        time.sleep(0.2)
    assert (used, aborted) == (0, aborted_before + 1)
    stats = _stats(server)
    assert stats["kv_blocks_used"] == 0 and stats["num_running"] == 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_a_whole_request_whose_client_gave_up_is_aborted(default_model):
    """Not streamed: outputs arrive every step, and the client timing out must still abort it
    (it used to run on to max_tokens for nobody)."""
    srv = start_server(default_model, 256, 2048)
    try:

        def counters():
            families = _metrics(srv)
            abort = _value(
                families, "vllm:request_success", "vllm:request_success_total",
                finished_reason="abort",
            )  # fmt: skip
            made = _value(families, "vllm:generation_tokens", "vllm:generation_tokens_total")
            return abort, made

        body = {"model": srv.model_name, "prompt": "Once upon a time", "max_tokens": 1500}
        body["ignore_eos"] = True  # so that only the abort can end it early
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{srv.base_url}/v1/completions", json=body, timeout=1.5)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            stats, (aborted, made) = _stats(srv), counters()
            if stats["num_running"] == 0 and aborted == 1:
                break
            time.sleep(0.2)
        assert (stats["num_running"], stats["kv_blocks_used"], aborted) == (0, 0, 1)
        assert 0 < made < 1500  # stopped early, not run on to max_tokens
    finally:
        srv.stop()


def test_metrics_use_vllm_names_and_types(client, server):
    client.chat.completions.create(**_chat(server, "Hello"))
    families = _metrics(server)
    expected = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter",
        "vllm:num_preemptions": "counter",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "kvscope_kv_blocks_used": "gauge",
        "kvscope_kv_blocks_cached": "gauge",
        "kvscope_kv_useful_slot_share": "gauge",
        "kvscope_naive_kv_blocks_used": "gauge",
    }
    assert {name: families[name].type for name in expected} == expected
    labels = {"model_name": server.model_name, "engine": "0"}
    assert _value(families, "vllm:generation_tokens", "vllm:generation_tokens_total", **labels) > 0
    assert _value(families, "vllm:prompt_tokens", "vllm:prompt_tokens_total", **labels) > 0
    count = _value(
        families,
        "vllm:time_to_first_token_seconds",
        "vllm:time_to_first_token_seconds_count",
        **labels,
    )
    assert count >= 1
    stats = _stats(server)
    assert (
        _value(families, "vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total")
        == (stats["prefix_cache_query_tokens"])
    )
    assert (
        _value(families, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total")
        == (stats["prefix_cache_hit_tokens"])
    )
    assert _value(families, "kvscope_kv_blocks_total") == stats["kv_blocks_total"]


# ---- errors: each an OpenAI error body, and the server keeps serving ----------------------------
def _error_of(status_body, status, param=None):
    code, body = status_body
    assert code == status, body
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"]
    if param is not None:
        assert error["param"] == param
    return error


def test_bad_requests_get_openai_error_bodies(server):
    path = "/v1/chat/completions"
    ok = json.dumps(_chat(server)).encode()
    _error_of(_post(server, path, b'{"model": "x", "messages": ['), 400)
    wrong_type = json.dumps(_chat(server, max_tokens="lots")).encode()
    assert "max_tokens" in _error_of(_post(server, path, wrong_type), 400, "max_tokens")["message"]
    no_messages = json.dumps({"model": server.model_name}).encode()
    _error_of(_post(server, path, no_messages), 400, "messages")
    unknown = json.dumps({**_chat(server), "model": "gpt-17"}).encode()
    assert _error_of(_post(server, path, unknown), 404, "model")["code"] == "model_not_found"
    _error_of(_post(server, path, ok, key=None), 401)
    _error_of(_post(server, path, ok, key="wrong"), 401)
    too_long = json.dumps(_chat(server, "word " * (MAX_MODEL_LEN + 50))).encode()
    message = _error_of(_post(server, path, too_long), 400, "messages")["message"]
    assert str(MAX_MODEL_LEN) in message
    too_many = json.dumps(_chat(server, max_tokens=MAX_MODEL_LEN + 1)).encode()
    _error_of(_post(server, path, too_many), 400, "max_tokens")
    _error_of(_announce_huge_body(server, path), 413)
    completions = json.dumps({"model": server.model_name, "prompt": "Hi", "echo": True}).encode()
    _error_of(_post(server, "/v1/completions", completions), 400, "echo")
    # /health needs no key; everything else does.
    assert _get(server, "/health", key=None) == b""
    with pytest.raises(urllib.error.HTTPError) as e:
        _get(server, "/metrics", key=None)
    assert e.value.code == 401
    # ... and the server still serves.
    status, body = _post(server, path, ok)
    assert status == 200 and body["choices"][0]["message"]["content"]


def test_serve_bench_loses_nothing(server):
    settings = ServeBenchSettings(clients=3, requests=3, max_tokens=3, system_chars=400)
    report = run_load("127.0.0.1", server.port, server.model_name, settings, api_key=KEY)
    assert report["requests_lost"] == 0 and report["requests_completed"] == 3, report["errors"]
    assert report["ttft_p50_s"] > 0 and report["itl_p50_s"] > 0
    # Every request shares the agent system prompt, cached by run_load's warm-up request.
    assert report["prefix_hit_rate"] > 0.5
    assert report["client_cached_prompt_share"] > 0.5


def test_concurrent_clients_share_one_batch(client, server):
    results: list[str] = []

    def one(i: int) -> None:
        r = client.chat.completions.create(**_chat(server, f"Say {i}", temperature=0))
        results.append(r.choices[0].finish_reason)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 4 and set(results) <= {"stop", "length"}
    assert _stats(server)["peak_num_running"] >= 2


def test_tokenize_gives_the_ids_the_chat_endpoint_prefills(client, server):
    """A router counts a chat's prompt blocks from /tokenize: the ids must be the ones the chat
    endpoint prefills (usage.prompt_tokens), and /detokenize must give the text back."""
    model = server.model_name
    messages = [{"role": "user", "content": "Name a colour."}]
    status, body = _post(
        server, "/tokenize", json.dumps({"model": model, "messages": messages}).encode()
    )
    assert status == 200, body
    assert body["count"] == len(body["tokens"]) > 5 and body["max_model_len"] == MAX_MODEL_LEN
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=1)
    assert chat.usage.prompt_tokens == body["count"]
    status, text = _post(server, "/detokenize", json.dumps({"tokens": body["tokens"]}).encode())
    assert status == 200 and "Name a colour." in text["prompt"]
    status, plain = _post(server, "/tokenize", json.dumps({"prompt": "Name a colour."}).encode())
    assert status == 200 and 0 < plain["count"] < body["count"]
    for bad, param in (
        ({"model": model}, "prompt"),  # neither prompt nor messages
        ({"prompt": "x", "messages": messages}, "prompt"),  # both
        ({"prompt": ""}, "prompt"),
    ):
        assert _error_of(_post(server, "/tokenize", json.dumps(bad).encode()), 400, param)
    assert _error_of(
        _post(server, "/detokenize", json.dumps({"tokens": [10**9]}).encode()), 400, "tokens"
    )
    assert _error_of(
        _post(server, "/tokenize", json.dumps({"model": "nope", "prompt": "x"}).encode()), 404
    )


def test_cache_config_info_names_block_size_and_hash(server):
    families = _metrics(server)
    (sample,) = families["vllm:cache_config_info"].samples
    assert sample.value == 1
    assert sample.labels["block_size"] == str(server.driver.engine.config.block_size)
    # The server's default, vLLM's name for how our KV events hash blocks.
    assert sample.labels["prefix_caching_hash_algo"] == "sha256"
    assert sample.labels["enable_prefix_caching"] == "True"


def test_serve_flags_default_to_this_machine_only():
    from kvscope.app.cli.main import build_parser

    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port, args.api_key, args.kv_events) == ("127.0.0.1", 8000, None, None)
    assert args.kv_events_encoding == "map"  # vLLM 0.33's layout
    bench = build_parser().parse_args(
        ["bench", "--serve", "--clients", "4", "--max-model-len", "512"]
    )
    assert (bench.serve, bench.clients, bench.max_model_len) == (True, 4, 512)
    from kvscope.app.bench.serving.bench import server_command

    big = build_parser().parse_args(["bench", "--serve", "--clients", "100", "--dtype", "float32"])
    cmd = server_command(big, 9999, big.clients)
    assert cmd[cmd.index("-m") + 1 :][:6] == [
        "kvscope.app.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "9999",
    ]
    assert cmd[cmd.index("--max-num-seqs") + 1] == "100"  # every client in one batch
    assert cmd[cmd.index("--dtype") + 1] == "float32"
