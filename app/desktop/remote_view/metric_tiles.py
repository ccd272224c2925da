"""What a replica's tiles say, from its /metrics history (app/remote/metrics_scrape.py).

Rates and means are over the last RATE_WINDOW_S of scrapes, not one poll interval: at one
scrape a second most intervals see no finished request, and a mean over none says nothing.
Every tile says what it could not know ("—", "no requests in 10 s") rather than a zero."""

from __future__ import annotations

from kvscope.app.remote.metrics_scrape import MetricsDelta, RemoteMetrics

RATE_WINDOW_S = 10.0
TILES = (
    ("usage", "KV USAGE", "vllm:kv_cache_usage_perc: share of the server's KV blocks in use."),
    ("seqs", "RUN · WAIT", "vllm:num_requests_running and _waiting."),
    ("preempt", "PREEMPTIONS", "vllm:num_preemptions_total, and how many in the window."),
    (
        "prefix",
        "PREFIX HITS",
        "Prompt tokens served from the server's prefix cache over the window"
        " (vllm:prefix_cache_hits / _queries), and since it started.",
    ),
    ("ttft", "TTFT", "Mean time to first token of the requests finished in the window."),
    ("itl", "ITL", "Mean inter-token latency over the window."),
    ("rate", "TOKENS / S", "Generated tokens per second over the window (prompt tokens below)."),
)


def window_delta(history: list[tuple[float, RemoteMetrics]]) -> MetricsDelta | None:
    """The delta from the scrape ~RATE_WINDOW_S before the newest to the newest."""
    if len(history) < 2:
        return None
    newest = history[-1][1]
    prev = history[0][1]
    for _t, m in reversed(history[:-1]):
        prev = m
        if newest.scraped_at - m.scraped_at >= RATE_WINDOW_S:
            break
    return MetricsDelta(prev, newest)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def _num(x: float | None, fmt: str = "{:,.0f}") -> str:
    return "—" if x is None else fmt.format(x)


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1000:,.0f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def tile_texts(metrics: RemoteMetrics | None, history: list) -> dict[str, tuple[str, str]]:
    """Tile key -> (value, detail)."""
    if metrics is None:
        return {key: ("—", "no /metrics yet") for key, _c, _t in TILES}
    d = window_delta(history)
    span = f"{d.interval_s:.0f} s" if d is not None else ""
    blocks = metrics.num_gpu_blocks
    usage_detail = f"of {blocks:,} blocks" if blocks else "of the server's pool"
    prefix_value = _pct(d.prefix_hit_rate) if d is not None else "—"
    prefix_detail = f"lifetime {_pct(metrics.prefix_hit_rate)}"
    if d is not None and d.prefix_hit_rate is None:
        prefix_detail = f"none in {span} · " + prefix_detail
    elif d is not None:
        prefix_detail = f"over {span} · " + prefix_detail
    out = {
        "usage": (_pct(metrics.kv_cache_usage), usage_detail),
        "seqs": (f"{_num(metrics.running)} · {_num(metrics.waiting)}", "running · waiting"),
        "preempt": (
            _num(metrics.preemptions_total),
            f"+{d.preemptions:,.0f} in {span}" if d and d.preemptions is not None else "total",
        ),
        "prefix": (prefix_value, prefix_detail),
    }
    for key, name in (("ttft", "ttft"), ("itl", "itl")):
        hist = getattr(metrics, name)
        mean = getattr(d, f"{name}_mean") if d is not None else None
        lifetime = hist.mean if hist is not None else None
        if hist is None:
            mean, detail = None, "not in /metrics"
        elif d is None:
            mean, detail = lifetime, "lifetime mean"
        elif mean is not None:
            detail = f"mean over {span}"
        else:
            detail = f"none in {span} · lifetime {_ms(lifetime)}"
        out[key] = (_ms(mean), detail)
    gen = d.generation_tokens_per_s if d is not None else None
    prompt = d.prompt_tokens_per_s if d is not None else None
    rate_detail = f"over {span}" if prompt is None else f"prompt {prompt:,.0f}/s over {span}"
    out["rate"] = (_num(gen, "{:,.1f}"), rate_detail)
    if d is None:
        out["rate"] = ("—", "needs two scrapes")
    if d is not None and d.reset:
        out["preempt"] = (out["preempt"][0], "counters reset: server restarted")
    return out
