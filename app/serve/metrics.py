"""Prometheus metrics under vLLM's names, so dashboards built for vLLM work unchanged, plus our
own `kvscope_*` block-pool gauges. Names, types, label names and histogram buckets follow
vllm/v1/metrics/loggers.py (PrometheusStatLogger; vllm-project/vllm @ 005a810b, with
`vllm:inter_token_latency_seconds` as later versions name the per-token gap). Counters appear
with prometheus_client's `_total` suffix, exactly as vLLM's do.

Differences, stated: `vllm:num_requests_running` / `_waiting` count sequences (a request with
n samples counts n), because that is what the scheduler batches.

Everything is updated in the engine thread after a step (or an abort); the registry is this
server's own, so two servers in one process never collide."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine import LLMEngine, RequestOutput

LABELS = ["model_name", "engine"]
TTFT_BUCKETS = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
]  # fmt: skip
ITL_BUCKETS = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
]  # fmt: skip
REQUEST_LATENCY_BUCKETS = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
]  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort")
HASH_ALGO = "xxh3_64_salted"  # engine/kv/block_manager.py hash_block
POOL_REFRESH_S = 0.1  # the pool snapshot behind kvscope_* gauges, at most this often mid-run


class _Tracked:
    __slots__ = ("arrival", "last_token", "tokens")

    def __init__(self, arrival: float) -> None:
        self.arrival = arrival
        self.last_token: float | None = None
        self.tokens = 0


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        values = (model_name, "0")
        reg = self.registry

        def gauge(name, doc):
            return Gauge(name, doc, LABELS, registry=reg).labels(*values)

        def counter(name, doc):
            return Counter(name, doc, LABELS, registry=reg).labels(*values)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, LABELS, buckets=buckets, registry=reg).labels(*values)

        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            LABELS + ["finished_reason"],
            registry=reg,
        )
        self.success = {r: success.labels(*values, r) for r in FINISH_REASONS}
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        # Ours: the block pool as the app's map shows it, and the naive allocator beside it.
        self.pool = {
            name: Gauge(f"kvscope_{name}", doc, ["model_name"], registry=reg).labels(model_name)
            for name, doc in (
                ("kv_blocks_total", "KV blocks in the pool."),
                ("kv_blocks_used", "KV blocks held by sequences."),
                ("kv_blocks_free", "KV blocks free (including cached)."),
                ("kv_blocks_cached", "Free KV blocks that still hold a reusable prefix."),
                ("kv_blocks_shared", "KV blocks held by more than one sequence."),
                ("kv_useful_slot_share", "Share of held KV slots that hold K/V (0..1)."),
                ("naive_kv_blocks_used", "Blocks the naive contiguous allocator would hold."),
                ("naive_useful_slot_share", "Useful-slot share of the naive allocator (0..1)."),
                ("naive_requests_would_wait", "Sequences the naive allocator could not place."),
            )
        }
        self._tracked: dict[str, _Tracked] = {}
        self._seen = {"query": 0, "hit": 0, "preempt": 0}
        self._last_pool = 0.0

    def describe_cache(self, engine: LLMEngine) -> None:
        """`vllm:cache_config_info`, vLLM's info gauge of its CacheConfig (value 1, the facts as
        labels): a remote viewer reads the block size and the hash algorithm from it. Our hash
        is xxh3-64 salted with the model file's path and KV dtype, which we do not publish, so
        the name says it cannot be reproduced elsewhere (viewers match token ids instead)."""
        c = engine.config
        info = {
            "block_size": str(c.block_size),
            "cache_dtype": str(c.kv_torch_dtype).removeprefix("torch."),
            "enable_prefix_caching": str(bool(c.enable_prefix_caching)),
            "num_gpu_blocks": str(engine.block_manager.num_blocks),
            "prefix_caching_hash_algo": HASH_ALGO,
            "engine": "0",
        }
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            list(info),
            registry=self.registry,
        ).labels(**info).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ---- the engine thread ---------------------------------------------------------------
    def track(self, request_id: str, arrival: float) -> None:
        self._tracked[request_id] = _Tracked(arrival)

    def observe(self, engine: LLMEngine, outputs: list[RequestOutput]) -> None:
        """After a step or an abort: per-request latencies, token counters, pool gauges."""
        now = time.time()
        for out in outputs:
            self._observe_request(out, now)
        self._refresh_pool(engine, now)

    def _observe_request(self, out: RequestOutput, now: float) -> None:
        tracked = self._tracked.get(out.request_id)
        if tracked is None:
            return
        tokens = sum(len(c.token_ids) for c in out.outputs)
        new = tokens - tracked.tokens
        if new > 0:
            self.generation_tokens.inc(new)
            if tracked.last_token is None:
                self.ttft.observe(now - tracked.arrival)
                self.prompt_tokens.inc(len(out.prompt_token_ids))
            else:
                self.itl.observe(now - tracked.last_token)
            tracked.last_token = now
            tracked.tokens = tokens
        if out.finished:
            del self._tracked[out.request_id]
            self.e2e.observe(now - tracked.arrival)
            reasons = [c.finish_reason for c in out.outputs]
            reason = (
                "abort" if "abort" in reasons else ("length" if "length" in reasons else "stop")
            )
            self.success[reason].inc()

    def _refresh_pool(self, engine: LLMEngine, now: float) -> None:
        stats = engine.stats()
        self.running.set(stats["num_running"])
        self.waiting.set(stats["num_waiting"])
        self.kv_usage.set(stats["kv_blocks_used"] / max(1, stats["kv_blocks_total"]))
        for key, stat, metric in (
            ("query", "prefix_cache_query_tokens", self.prefix_queries),
            ("hit", "prefix_cache_hit_tokens", self.prefix_hits),
            ("preempt", "num_preemptions", self.preemptions),
        ):
            metric.inc(max(0, stats[stat] - self._seen[key]))
            self._seen[key] = stats[stat]
        pool = self.pool
        pool["kv_blocks_total"].set(stats["kv_blocks_total"])
        pool["kv_blocks_used"].set(stats["kv_blocks_used"])
        pool["kv_blocks_free"].set(stats["kv_blocks_free"])
        pool["kv_blocks_cached"].set(stats["kv_blocks_cached"])
        # Snapshots copy the pool's arrays: mid-run, at most every POOL_REFRESH_S; always when
        # the engine goes idle, so a scrape after the traffic sees the final state.
        if engine.has_unfinished_requests() and now - self._last_pool < POOL_REFRESH_S:
            return
        self._last_pool = now
        snap = engine.kv_snapshot().metrics
        pool["kv_blocks_shared"].set(snap.blocks_shared)
        pool["kv_useful_slot_share"].set(snap.useful_slot_share)
        shadow = engine.shadow_snapshot()
        if shadow is not None:
            pool["naive_kv_blocks_used"].set(
                shadow.metrics.blocks_used + shadow.metrics.blocks_reserved
            )
            pool["naive_useful_slot_share"].set(shadow.metrics.useful_slot_share)
            pool["naive_requests_would_wait"].set(shadow.metrics.num_would_wait)
