"""A server's Prometheus counters around a serve bench run, read by name: vLLM's (which
`kvscope serve` exports) where they are, llama-server's own (llamacpp:*) under their own names,
and nothing, with the reason, from a server that has no /metrics at all."""

from __future__ import annotations

import http.client

from prometheus_client.parser import text_string_to_metric_families


class MetricsUnavailable(RuntimeError):
    """GET /metrics did not answer 200 (llama-server answers 501 unless started with --metrics)."""


def scrape(host: str, port: int, api_key: str | None) -> dict[str, float]:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        conn.request("GET", "/metrics", headers=headers)
        resp = conn.getresponse()
        text = resp.read().decode()
    finally:
        conn.close()
    if resp.status != 200:
        raise MetricsUnavailable(f"GET /metrics answered HTTP {resp.status}: {text[:120]!r}")
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.labels.get("finished_reason"):
                values[sample.name] = sample.value
    return values


def scrape_or_note(host: str, port: int, api_key: str | None) -> tuple[dict[str, float], str]:
    """The counters, or none and why: a server without /metrics is benched all the same."""
    try:
        return scrape(host, port, api_key), ""
    except MetricsUnavailable as e:
        return {}, str(e)


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    """A counter's growth over the run; None where the server has no counter of that name."""
    if name not in before or name not in after:
        return None
    return after[name] - before[name]


def other_counters(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """llama-server's own counters (llamacpp:*), under their own names: not vLLM's figures."""
    return {
        name: after[name] - before[name]
        for name in sorted(after)
        if name.startswith("llamacpp:") and name.endswith("_total") and name in before
    }
