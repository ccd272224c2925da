"""A reply's alternatives, each with its own figures: the samples of an n > 1 request, and the
replies Regenerate made before (it keeps them, rather than discarding the old reply).

Each alternative has an entry: its request's figures (TTFT, rate, prompt tokens) with the
per-sample lists cut to that one sample, and its own status ("stopped" for one cut short). The
message's `metrics` is then `merged(entries, selected)`: the chosen alternative's figures with
the per-sample lists spanning every alternative, the shape the bubble reads (format_metrics
indexes them by the alternative shown).
"""

from __future__ import annotations

PER_SAMPLE = ("sample_tokens", "finish_reasons")


def entries_of(texts: list[str], metrics: dict | None, status: str) -> list[dict]:
    """One entry per text of one request (its n samples, or its one reply)."""
    metrics = metrics or {}
    entries = []
    for j in range(len(texts)):
        entry = {k: v for k, v in metrics.items() if k not in PER_SAMPLE}
        for key in PER_SAMPLE:
            values = metrics.get(key) or []
            entry[key] = [values[j]] if j < len(values) else []
        entry["status"] = status
        entries.append(entry)
    return entries


def kept_entries(
    alternatives: list[str], content: str, metrics: dict, status: str, stored: list[dict]
) -> tuple[list[str], list[dict]]:
    """A stored reply's alternatives and their entries, as Regenerate keeps them: entries as
    stored, or (a reply from before they were kept) made from its metrics."""
    texts = list(alternatives) or [content]
    if len(stored) == len(texts):
        return texts, [dict(e) for e in stored]
    return texts, entries_of(texts, metrics, status)


def merged(entries: list[dict], selected: int) -> dict:
    """The message's metrics with alternative `selected` shown (see the module docstring)."""
    if not entries:
        return {}
    chosen = {k: v for k, v in entries[selected].items() if k != "status"}
    for key in PER_SAMPLE:
        values = [listed[0] if (listed := e.get(key)) else None for e in entries]
        chosen[key] = values if any(v is not None for v in values) else []
    return chosen


def status_of(entries: list[dict], selected: int, default: str) -> str:
    if 0 <= selected < len(entries):
        return entries[selected].get("status", default)
    return default
