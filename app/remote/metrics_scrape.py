"""Read a server's Prometheus /metrics text into the figures the remote view shows.

Names are vLLM's (vllm/v1/metrics/loggers.py; app/serve/metrics.py publishes the same), read
by sample name so that a counter with or without its `_created` companion, and either
generation of names, work:

- KV usage: `vllm:kv_cache_usage_perc` (0..1), older vLLM `vllm:gpu_cache_usage_perc`;
- prefix cache: `vllm:prefix_cache_queries_total` / `_hits_total` (tokens), older vLLM
  `vllm:gpu_prefix_cache_queries_total` / `_hits_total`;
- `vllm:num_requests_running` / `_waiting`, `vllm:num_preemptions_total`,
  `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`;
- histograms `vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds` (older
  vLLM `vllm:time_per_output_token_seconds`), `vllm:e2e_request_latency_seconds`;
- `vllm:cache_config_info`'s labels (block_size, num_gpu_blocks, prefix_caching_hash_algo, ...);
- our `kvscope_*` gauges when the server is `kvscope serve`.

A server with several engines (data parallel) labels each with `engine`; values are summed
over them (the usage gauge is averaged). The model is the `model_name` label."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
TTFT = ("vllm:time_to_first_token_seconds",)
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
E2E = ("vllm:e2e_request_latency_seconds",)
CACHE_CONFIG = "vllm:cache_config_info"
KVSCOPE_PREFIX = "kvscope_"


class MetricsParseError(ValueError):
    """The /metrics body is not Prometheus text; the message quotes the parser."""


@dataclass(frozen=True)
class HistogramValue:
    sum: float
    count: float
    buckets: tuple[tuple[float, float], ...]  # (upper bound "le", cumulative count), ascending

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """The upper bound of the first bucket holding the q-th observation (an upper bound on
        the quantile, as bucketed data allows); None without observations."""
        if self.count <= 0:
            return None
        rank = q * self.count
        for le, cumulative in self.buckets:
            if cumulative >= rank:
                return le
        return float("inf")


@dataclass(frozen=True)
class RemoteMetrics:
    scraped_at: float  # time.time() of the scrape
    model: str | None = None
    kv_cache_usage: float | None = None  # 0..1
    running: float | None = None
    waiting: float | None = None
    preemptions_total: float | None = None
    prefix_queries_total: float | None = None  # tokens
    prefix_hits_total: float | None = None  # tokens
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    ttft: HistogramValue | None = None
    itl: HistogramValue | None = None
    e2e: HistogramValue | None = None
    cache_config: dict[str, str] = field(default_factory=dict)
    kvscope: dict[str, float] = field(default_factory=dict)  # name without "kvscope_"
    names: frozenset[str] = frozenset()  # every sample name seen (what this server exposes)

    @property
    def block_size(self) -> int | None:
        size = _int_or_none(self.cache_config.get("block_size"))
        # A server's word, checked: vLLM's block sizes are 1..a few thousand tokens (mamba).
        return size if size is not None and 0 < size <= MAX_BLOCK_SIZE else None

    @property
    def num_gpu_blocks(self) -> int | None:
        return _int_or_none(self.cache_config.get("num_gpu_blocks"))

    @property
    def hash_algo(self) -> str | None:
        """vLLM's `prefix_caching_hash_algo` when its cache_config_info publishes it."""
        return self.cache_config.get("prefix_caching_hash_algo") or None

    @property
    def prefix_hit_rate(self) -> float | None:
        """Lifetime hit rate (tokens hit / tokens queried)."""
        if not self.prefix_queries_total:
            return None
        return (self.prefix_hits_total or 0.0) / self.prefix_queries_total


def parse_metrics(text: str, now: float | None = None) -> RemoteMetrics:
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[s.name].append((s.labels, s.value))
    except (ValueError, TypeError, IndexError) as e:
        raise MetricsParseError(f"not Prometheus text: {e}") from None

    def total(names: tuple[str, ...]) -> float | None:
        for name in names:
            if name in samples:
                return sum(v for _, v in samples[name])
        return None

    def mean(names: tuple[str, ...]) -> float | None:
        for name in names:
            if name in samples:
                values = [v for _, v in samples[name]]
                return sum(values) / len(values)
        return None

    def histogram(names: tuple[str, ...]) -> HistogramValue | None:
        for name in names:
            if f"{name}_count" not in samples:
                continue
            buckets: dict[float, float] = defaultdict(float)
            for labels, value in samples.get(f"{name}_bucket", ()):
                try:
                    buckets[float(labels.get("le", "nan"))] += value
                except ValueError:
                    continue
            return HistogramValue(
                sum=total((f"{name}_sum",)) or 0.0,
                count=total((f"{name}_count",)) or 0.0,
                buckets=tuple(sorted((le, c) for le, c in buckets.items() if le == le)),
            )
        return None

    model = None
    for rows in samples.values():
        for labels, _ in rows:
            if labels.get("model_name"):
                model = labels["model_name"]
                break
        if model:
            break
    config_rows = samples.get(CACHE_CONFIG, [])
    cache_config = dict(config_rows[0][0]) if config_rows else {}
    kvscope = {
        name[len(KVSCOPE_PREFIX) :]: sum(v for _, v in rows)
        for name, rows in samples.items()
        if name.startswith(KVSCOPE_PREFIX)
    }
    return RemoteMetrics(
        scraped_at=time.time() if now is None else now,
        model=model,
        kv_cache_usage=mean(KV_USAGE),
        running=total(("vllm:num_requests_running",)),
        waiting=total(("vllm:num_requests_waiting",)),
        preemptions_total=total(("vllm:num_preemptions_total",)),
        prefix_queries_total=total(PREFIX_QUERIES),
        prefix_hits_total=total(PREFIX_HITS),
        prompt_tokens_total=total(("vllm:prompt_tokens_total",)),
        generation_tokens_total=total(("vllm:generation_tokens_total",)),
        ttft=histogram(TTFT),
        itl=histogram(ITL),
        e2e=histogram(E2E),
        cache_config=cache_config,
        kvscope=kvscope,
        names=frozenset(samples),
    )


class MetricsDelta:
    """Rates between two scrapes of one server. A counter that went down means the server
    restarted: its new value is the delta (Prometheus' reset rule), and `reset` says so."""

    def __init__(self, prev: RemoteMetrics, cur: RemoteMetrics) -> None:
        self.prev, self.cur = prev, cur
        self.interval_s = cur.scraped_at - prev.scraped_at
        self.reset = False

    def _delta(self, prev: float | None, cur: float | None) -> float | None:
        if cur is None or prev is None:
            return None
        if cur < prev:
            self.reset = True
            return cur
        return cur - prev

    @property
    def prefix_queries(self) -> float | None:
        return self._delta(self.prev.prefix_queries_total, self.cur.prefix_queries_total)

    @property
    def prefix_hit_rate(self) -> float | None:
        """Tokens hit / tokens queried over the interval; None when nothing was queried."""
        queries = self.prefix_queries
        hits = self._delta(self.prev.prefix_hits_total, self.cur.prefix_hits_total)
        if not queries or hits is None:
            return None
        return hits / queries

    def _hist_mean(self, prev: HistogramValue | None, cur: HistogramValue | None) -> float | None:
        if cur is None:
            return None
        if prev is None or cur.count < prev.count:
            if prev is not None:
                self.reset = True
            return cur.mean
        count = cur.count - prev.count
        return (cur.sum - prev.sum) / count if count > 0 else None

    @property
    def ttft_mean(self) -> float | None:
        return self._hist_mean(self.prev.ttft, self.cur.ttft)

    @property
    def itl_mean(self) -> float | None:
        return self._hist_mean(self.prev.itl, self.cur.itl)

    def _rate(self, prev: float | None, cur: float | None) -> float | None:
        delta = self._delta(prev, cur)
        if delta is None or self.interval_s <= 0:
            return None
        return delta / self.interval_s

    @property
    def generation_tokens_per_s(self) -> float | None:
        return self._rate(self.prev.generation_tokens_total, self.cur.generation_tokens_total)

    @property
    def prompt_tokens_per_s(self) -> float | None:
        return self._rate(self.prev.prompt_tokens_total, self.cur.prompt_tokens_total)

    @property
    def preemptions(self) -> float | None:
        return self._delta(self.prev.preemptions_total, self.cur.preemptions_total)


MAX_BLOCK_SIZE = 1 << 16


def _int_or_none(value: str | None) -> int | None:
    """An integer label value, or None for anything else ("inf", "nan", "x", 1e400)."""
    try:
        return int(float(value)) if value not in (None, "", "None") else None
    except (ValueError, OverflowError):
        return None
