"""`kvscope serve`'s /metrics judged by vLLM 0.33.0's own code (tests/vllm_code.py imports it
from vLLM's wheel; nothing of it is copied here).

vLLM's PrometheusStatLogger is built for a server like ours (same served name, max_model_len and
block size) and registers its default families in prometheus_client's global REGISTRY; they are
read from there and unregistered at once, so no other test sees them (our server has a registry
of its own). Against a live `kvscope serve`: every one of vLLM's families is ours with its type,
label names, label values, histogram buckets and help text, and `vllm:cache_config_info` has
vLLM's label set, with values vLLM's own CacheConfig accepts and renders the same. Then the
numbers: after requests that end by "length", by "stop", with n=2 and failed by the engine, the
counters and histograms agree with what the responses reported."""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from types import SimpleNamespace as NS

import pytest
import vllm_code
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from served import start_server

from kvscope.app.remote.metrics_scrape import parse_metrics

BLOCK_SIZE = 16
NUM_BLOCKS = 12  # small, so that two long prompts at once preempt (the last test)
MAX_MODEL_LEN = 256
CACHE_INFO = "vllm:cache_config_info"
# Long enough to fill whole blocks, so that asking it again hits the prefix cache.
PROMPT = (
    "The capital of France is Paris. The capital of Spain is Madrid. The capital of Italy is "
    "Rome. The capital of Germany is"
)


@pytest.fixture(scope="module")
def server(default_model):
    srv = start_server(default_model, NUM_BLOCKS, MAX_MODEL_LEN, block_size=BLOCK_SIZE)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def vllm(server):
    """vLLM's default families for a server like ours, and its /metrics text, as its
    PrometheusStatLogger registers them once the engine is up (log_engine_initialized)."""
    loggers = vllm_code.module("vllm.v1.metrics.loggers")
    prometheus = vllm_code.module("vllm.v1.metrics.prometheus")
    cache = vllm_code.module("vllm.config.cache").CacheConfig(block_size=BLOCK_SIZE)
    config = NS(
        observability_config=NS(
            show_hidden_metrics=False, kv_cache_metrics=False, custom_histogram_buckets=None
        ),
        model_config=NS(
            served_model_name=server.model_name, max_model_len=MAX_MODEL_LEN, is_diffusion=False
        ),
        # None: the features a default server runs without (their families are not default).
        speculative_config=None,
        kv_transfer_config=None,
        watermark_config=None,
        lora_config=None,
        cache_config=cache,
    )
    try:
        loggers.PrometheusStatLogger(config).log_engine_initialized()
        families = {f.name: f for f in REGISTRY.collect() if f.name.startswith("vllm:")}
        text = generate_latest(REGISTRY).decode()
    finally:
        prometheus.unregister_vllm_metrics()  # REGISTRY is the process's: leave it as found
    return NS(families=families, text=text, cache=vllm_code.module("vllm.config.cache"))


def _scrape(server) -> dict:
    """Our families by name, as Prometheus' text parser reads them (counters without
    `_total`, the same names REGISTRY.collect() gives vLLM's)."""
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=60) as response:
        text = response.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def _label_names(family) -> set[str]:
    return {k for s in family.samples for k in s.labels if k != "le"}


def _label_sets(family) -> set[frozenset]:
    return {
        frozenset((k, v) for k, v in s.labels.items() if k != "le")
        for s in family.samples
        if not s.name.endswith("_created")
    }


def _buckets(family) -> list[float]:
    return sorted(float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket"))


def test_every_default_vllm_family_is_ours_alike(server, vllm):
    # What vLLM 0.33.0 registers by default: 35 families and cache_config_info. A different
    # count means the stand-in config above switched a feature on or off.
    assert len(vllm.families) == 36 and CACHE_INFO in vllm.families
    ours = _scrape(server)
    wrong = []
    for name, theirs in vllm.families.items():
        mine = ours.get(name)
        if mine is None:
            wrong.append(f"{name}: missing")
            continue
        if mine.type != theirs.type:
            wrong.append(f"{name}: {mine.type}, vLLM's is a {theirs.type}")
        if _label_names(mine) != _label_names(theirs):
            wrong.append(f"{name}: labels {_label_names(mine)} != {_label_names(theirs)}")
        elif name != CACHE_INFO and _label_sets(mine) != _label_sets(theirs):
            wrong.append(f"{name}: label values {_label_sets(mine)} != {_label_sets(theirs)}")
        if _buckets(mine) != _buckets(theirs):
            wrong.append(f"{name}: buckets {_buckets(mine)} != {_buckets(theirs)}")
        if mine.documentation != theirs.documentation:
            wrong.append(f"{name}: help {mine.documentation!r} != {theirs.documentation!r}")
    assert not wrong, "\n".join(wrong)
    # Ours besides: the block-pool gauges vLLM has not.
    assert "kvscope_kv_blocks_used" in ours


def test_cache_config_info_is_vllms_with_our_engines_settings(server, vllm):
    (theirs,) = vllm.families[CACHE_INFO].samples
    (mine,) = _scrape(server)[CACHE_INFO].samples
    assert mine.value == 1
    assert set(mine.labels) == set(theirs.labels)
    engine = server.driver.engine
    # The settings of ours that vLLM's CacheConfig has, given to vLLM's own CacheConfig: it
    # must accept every one of our values (its names for dtypes and hash algorithms, its ranges)
    # and render each exactly as we publish it.
    given = vllm.cache.CacheConfig(
        block_size=int(mine.labels["block_size"]),
        gpu_memory_utilization=float(mine.labels["gpu_memory_utilization"]),
        cache_dtype=mine.labels["cache_dtype"],
        num_gpu_blocks_override=int(mine.labels["num_gpu_blocks_override"]),
        enable_prefix_caching=mine.labels["enable_prefix_caching"] == "True",
        prefix_caching_hash_algo=mine.labels["prefix_caching_hash_algo"],
    )
    # Set after KV cache initialization in vLLM, from the pool it built.
    given.num_gpu_blocks = engine.allocator.num_blocks
    given.effective_attention_block_size = BLOCK_SIZE  # the bundled model attends fully
    # vLLM's capacity for one full-attention group: cdiv(max_model_len, block_size) blocks each.
    given.kv_cache_max_concurrency = NUM_BLOCKS / math.ceil(MAX_MODEL_LEN / BLOCK_SIZE)
    given.kv_cache_size_tokens = int(given.kv_cache_max_concurrency * MAX_MODEL_LEN)
    expected = given.metrics_info()
    expected["engine"] = "0"
    # vLLM says True when its block size came from the command line; we cannot tell our
    # default from a choice and say False (cache_info.py).
    expected["user_specified_block_size"] = "False"
    assert mine.labels == expected
    # And they are this engine's: its pool, its block size, the server's hash algorithm.
    config = engine.config
    assert mine.labels["num_gpu_blocks"] == str(engine.stats()["kv_blocks_total"])
    assert mine.labels["num_gpu_blocks"] == mine.labels["num_gpu_blocks_override"]
    assert mine.labels["num_gpu_blocks"] == str(NUM_BLOCKS)  # what start_server asked for
    assert (mine.labels["block_size"], mine.labels["prefix_caching_hash_algo"]) == ("16", "sha256")
    assert float(mine.labels["gpu_memory_utilization"]) == config.gpu_memory_utilization
    # The KV cache holds the model's dtype (float32 here): vLLM's "auto".
    assert config.kv_torch_dtype == config.torch_dtype and mine.labels["cache_dtype"] == "auto"


def test_the_remote_view_reads_vllms_cache_config_info_and_ours(server, vllm):
    theirs = parse_metrics(vllm.text)
    assert (theirs.block_size, theirs.hash_algo, theirs.num_gpu_blocks) == (16, "sha256", None)
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=60) as response:
        mine = parse_metrics(response.read().decode())
    assert (mine.block_size, mine.hash_algo, mine.num_gpu_blocks) == (16, "sha256", NUM_BLOCKS)


# ---- the numbers -------------------------------------------------------------------------------
def _complete(server, **body) -> tuple[int, dict, float]:
    """POST /v1/completions: (status, body, seconds the client waited)."""
    data = json.dumps({"model": server.model_name, "prompt": PROMPT} | body).encode()
    request = urllib.request.Request(
        server.base_url + "/v1/completions", data, {"Content-Type": "application/json"}
    )
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            status, answer = response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        status, answer = e.code, json.loads(e.read())
    return status, answer, time.monotonic() - start


def _value(families, family, suffix="", **labels) -> float:
    f = families[family]
    name = f.name + (suffix or ("_total" if f.type == "counter" else ""))
    return sum(
        s.value
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


class Deltas:
    """Scrapes before and after: how much each sample moved."""

    def __init__(self, server) -> None:
        self.server = server
        self.before = _scrape(server)
        self.after = self.before

    def wait(self, finished: int) -> None:
        """Until `finished` more samples are counted: the HTTP answer can leave before the
        engine thread's metrics hook has run."""
        deadline = time.monotonic() + 60
        while self("vllm:request_success") < finished and time.monotonic() < deadline:
            time.sleep(0.05)
            self.after = _scrape(self.server)

    def __call__(self, family, suffix="", **labels) -> float:
        return _value(self.after, family, suffix, **labels) - _value(
            self.before, family, suffix, **labels
        )


def test_the_numbers_are_what_the_requests_did(server):
    d = Deltas(server)
    answers, waited, n_of = [], [], []

    def ask(**body) -> dict:
        status, answer, seconds = _complete(server, **body)
        assert status == 200, answer
        answers.append(answer)
        waited.append(seconds)
        n_of.append(body.get("n", 1))
        return answer

    greedy = ask(max_tokens=4, temperature=0)
    assert greedy["choices"][0]["finish_reason"] == "length"
    # Again, stopped at its first word: the prompt's full blocks come from the prefix cache.
    word = greedy["choices"][0]["text"].split()[0]
    stopped = ask(max_tokens=4, temperature=0, stop=[word])
    assert stopped["choices"][0]["finish_reason"] == "stop"
    forked = ask(max_tokens=3, temperature=0.8, seed=7, n=2)
    # Both samples ran to max_tokens, so each has 3 tokens (usage only gives their total).
    assert [c["finish_reason"] for c in forked["choices"]] == ["length", "length"]
    longest = [greedy["usage"]["completion_tokens"], stopped["usage"]["completion_tokens"], 3]
    samples = sum(n_of)
    d.wait(samples)

    reasons = Counter(c["finish_reason"] for a in answers for c in a["choices"])
    for reason in ("stop", "length", "abort", "error", "repetition"):
        assert d("vllm:request_success", finished_reason=reason) == reasons[reason], reason
    usage = [a["usage"] for a in answers]
    prompt = [u["prompt_tokens"] for u in usage]
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usage]
    generated = sum(u["completion_tokens"] for u in usage)
    assert cached[1] >= BLOCK_SIZE
    # Each of the n samples counts as a request, as vLLM's n child requests do.
    assert d("vllm:prompt_tokens") == sum(p * n for p, n in zip(prompt, n_of, strict=True))
    assert d("vllm:generation_tokens") == generated
    assert d("vllm:request_prompt_tokens", "_count") == samples
    assert d("vllm:request_prompt_tokens", "_sum") == d("vllm:prompt_tokens")
    assert d("vllm:request_generation_tokens", "_count") == samples
    assert d("vllm:request_generation_tokens", "_sum") == generated
    # Computed: the prompt less its prefix-cache hit, once per prefill; the second sample of
    # n=2 forks from the first's blocks, which counts as a local cache hit.
    computed = sum(p - c for p, c in zip(prompt, cached, strict=True))
    assert d("vllm:prompt_tokens_by_source", source="local_compute") == computed
    reused = d("vllm:prompt_tokens") - computed
    assert d("vllm:prompt_tokens_by_source", source="local_cache_hit") == reused
    assert d("vllm:prompt_tokens_by_source", source="external_kv_transfer") == 0
    assert d("vllm:prompt_tokens_cached") == reused
    assert d("vllm:request_prefill_kv_computed_tokens", "_sum") == computed
    assert d("vllm:prefix_cache_hits") == sum(cached)
    assert d("vllm:prompt_tokens_cached_by_source", source="device") == sum(cached)
    # Requests one after the other, each prompt in one step: one engine step per token of a
    # request's longest sample, and over them the prompt tokens computed plus those generated.
    assert d("vllm:iteration_tokens_total", "_count") == sum(longest)
    assert d("vllm:iteration_tokens_total", "_sum") == computed + generated
    assert d("vllm:request_max_num_generation_tokens", "_sum") == sum(longest)
    assert d("vllm:request_params_n", "_count") == len(answers)
    assert d("vllm:request_params_n", "_sum") == samples
    assert d("vllm:request_params_max_tokens", "_sum") == 4 + 4 + 3 * 2
    for family in (
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:request_num_preemptions",
    ):
        assert d(family, "_count") == samples, family
    # A gap between tokens for every token after a sample's first.
    assert d("vllm:inter_token_latency_seconds", "_count") == generated - samples
    # The server cannot have taken longer than its clients waited; inference (first step to
    # last token) is part of end to end, and prefill plus decode is inference.
    e2e = d("vllm:e2e_request_latency_seconds", "_sum")
    inference = d("vllm:request_inference_time_seconds", "_sum")
    assert 0 < e2e <= sum(w * n for w, n in zip(waited, n_of, strict=True))
    assert 0 < inference <= e2e
    phases = d("vllm:request_prefill_time_seconds", "_sum")
    phases += d("vllm:request_decode_time_seconds", "_sum")
    assert phases == pytest.approx(inference)
    assert d("vllm:request_num_preemptions", "_sum") == 0  # the pool holds them all


def test_a_sample_the_engine_failed_counts_as_error(server):
    d = Deltas(server)
    engine = server.driver.engine
    sampler = engine.sampler

    def broken(*_args):
        raise RuntimeError("sampler broken by the test")

    server.driver.call(lambda e: setattr(e, "sampler", broken)).result(timeout=60)
    try:
        status, answer, _ = _complete(server, max_tokens=2)
    finally:
        server.driver.call(lambda e: setattr(e, "sampler", sampler)).result(timeout=60)
    assert status == 500 and "sampler broken" in answer["error"]["message"]
    d.wait(1)
    assert d("vllm:request_success", finished_reason="error") == 1
    assert d("vllm:request_success", finished_reason="abort") == 0
    assert d("vllm:request_generation_tokens", "_sum") == 0


def test_preemptions_are_counted_per_request(server):
    """Two prompts of 95 tokens take 6 of the 12 blocks each; their second decode needs a 7th
    block, so the newer one is preempted (recomputed later). Both reach the engine in one drain:
    its thread is held in a call until both are queued."""
    d = Deltas(server)
    held, release = threading.Event(), threading.Event()

    def hold(_engine):
        held.set()
        release.wait(60)

    server.driver.call(hold)
    assert held.wait(60)
    answers: list = [None, None]

    def ask(i: int) -> None:
        tokens = list(range(1000 + 1000 * i, 1095 + 1000 * i))  # no two share a block
        answers[i] = _complete(server, prompt=tokens, max_tokens=4, temperature=0)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        # Both requests queued behind the held call (the server tracks each before its add).
        deadline = time.monotonic() + 60
        while server.driver._commands.qsize() < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        release.set()
        for t in threads:
            t.join(120)
    for status, answer, _ in answers:
        assert status == 200, answer
        # Ran to max_tokens: no early stop that would have freed blocks before the preemption.
        assert answer["choices"][0]["finish_reason"] == "length"
    d.wait(2)
    preempted = d("vllm:num_preemptions")
    assert preempted >= 1
    # Per request, the same preemptions the engine's pool counted.
    assert d("vllm:request_num_preemptions", "_sum") == preempted
    assert d("vllm:request_num_preemptions", "_count") == 2
