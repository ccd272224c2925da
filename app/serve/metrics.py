"""Prometheus metrics under vLLM's names, so dashboards built for vLLM work unchanged, plus our
own `kvscope_*` block-pool gauges.

Checked against vLLM 0.33.0 by tests/app/remote/test_vllm_metrics.py, which builds vLLM's own
PrometheusStatLogger from its wheel (tests/vllm_code.py) and compares with a live `kvscope serve`:
every family vLLM registers by default is here with its name, type, label names, label values
and histogram buckets (the request-token buckets from our max_model_len, as vLLM derives them),
and `vllm:cache_config_info` has its label set. Counters appear with prometheus_client's `_total`
suffix, exactly as vLLM's do.

This module has the families read from the engine's stats after each step (scheduler queues, KV
usage, prefix-cache and preemption counters) and the info gauge (cache_info.py); the ones that
follow requests are in request_metrics.py. Families for what we do not have are published at
zero, as a vLLM server without the feature publishes them: external (KV connector) and
multimodal caches, the host/disk/p2p cache tiers, admission rejections (we queue every request
the pool can hold), `deferred` waiting (nothing defers a request here), and sleep (the engine is
always awake).

Differences, stated: `vllm:num_requests_running` / `_waiting` count sequences, as vLLM counts
its n child requests, except that a request waits as one until its prompt is computed and its
other samples fork from it; the rest in request_metrics.py (n samples, "repetition") and
cache_info.py (cache_dtype, capacity of sliding-window models).

Everything is updated in the engine thread after a step (or an abort); the registry is this
server's own, so two servers in one process never collide."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from kvscope.app.core.block_hashes import DEFAULT_ALGO
from kvscope.app.serve.cache_info import CACHE_CONFIG_LABELS, cache_config_info
from kvscope.app.serve.request_metrics import LABELS, RequestFamilies
from kvscope.engine import LLMEngine, RequestOutput

WAITING_REASONS = ("capacity", "deferred")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
POOL_REFRESH_S = 0.1  # the pool snapshot behind kvscope_* gauges, at most this often mid-run


class ServerMetrics:
    def __init__(
        self,
        model_name: str,
        max_model_len: int,
        prefix_caching_hash_algo: str = DEFAULT_ALGO,
    ) -> None:
        """`prefix_caching_hash_algo`: how the block hashes of our KV events are computed, by
        vLLM's name; cache_config_info publishes it, and remote viewers hash by it."""
        self.registry = CollectorRegistry()
        self.hash_algo = prefix_caching_hash_algo
        values = (model_name, "0")
        reg = self.registry

        def gauge(name, doc):
            return Gauge(name, doc, LABELS, registry=reg).labels(*values)

        def counter(name, doc):
            return Counter(name, doc, LABELS, registry=reg).labels(*values)

        def labelled(kind, name, doc, label, label_values):
            family = kind(name, doc, [*LABELS, label], registry=reg)
            return {v: family.labels(*values, v) for v in label_values}

        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.waiting_by_reason = labelled(
            Gauge,
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            "reason",
            WAITING_REASONS,
        )
        sleep = labelled(
            Gauge,
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
            "level 2.",
            "sleep_state",
            SLEEP_STATES,
        )
        sleep["awake"].set(1)
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
        counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in "
            "terms of number of queried tokens.",
        )
        counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in "
            "terms of number of cached tokens.",
        )
        counter(
            "vllm:mm_cache_queries",
            "Multi-modal cache queries, in terms of number of queried items.",
        )
        counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.")
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.cached_by_source = labelled(
            Counter,
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
            "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
            "vllm:external_prefix_cache_hits.",
            "source",
            CACHE_HIT_SOURCES,
        )
        admission = Counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"],  # vLLM's: no engine label (the frontend counts them)
            registry=reg,
        )
        for reason in ADMISSION_REASONS:
            admission.labels(model_name, reason)
        self.requests = RequestFamilies(reg, model_name, max_model_len)
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
        self._seen = {"query": 0, "hit": 0, "preempt": 0}
        self._steps_seen = 0
        self._last_pool = 0.0

    def describe_cache(self, engine: LLMEngine) -> None:
        """`vllm:cache_config_info` (value 1, the engine's cache settings as labels): a remote
        viewer reads the block size and the hash algorithm from it."""
        info = cache_config_info(engine, self.hash_algo)
        self._steps_seen = engine.num_steps  # an engine the app ran before serving
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            CACHE_CONFIG_LABELS,
            registry=self.registry,
        ).labels(**info).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ---- the engine thread ---------------------------------------------------------------
    def track(self, request_id: str, arrival: float) -> None:
        self.requests.track(request_id, arrival)

    def forget(self, request_id: str) -> None:
        self.requests.forget(request_id)

    @property
    def num_tracked(self) -> int:
        """Requests whose figures are being gathered (in flight, or not yet taken)."""
        return self.requests.num_tracked

    def observe(self, engine: LLMEngine, outputs: list[RequestOutput]) -> None:
        """After a step or an abort: the requests' families, then the engine's counters."""
        now = time.time()
        stepped = engine.num_steps != self._steps_seen  # not when only aborts ran
        self._steps_seen = engine.num_steps
        self.requests.observe(engine, outputs, now, stepped)
        self._refresh_pool(engine, now)

    def _refresh_pool(self, engine: LLMEngine, now: float) -> None:
        stats = engine.stats()
        self.running.set(stats["num_running"])
        self.waiting.set(stats["num_waiting"])
        self.waiting_by_reason["capacity"].set(stats["num_waiting"])
        self.kv_usage.set(stats["kv_blocks_used"] / max(1, stats["kv_blocks_total"]))
        for key, stat, metric in (
            ("query", "prefix_cache_query_tokens", self.prefix_queries),
            ("hit", "prefix_cache_hit_tokens", self.prefix_hits),
            ("preempt", "num_preemptions", self.preemptions),
        ):
            delta = max(0, stats[stat] - self._seen[key])
            metric.inc(delta)
            if key == "hit":  # vLLM counts every local prefix hit as the device tier's
                self.cached_by_source["device"].inc(delta)
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
