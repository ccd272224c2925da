"""Rates derived from successive snapshots and stats: tokens/s, recent prefix hit rate, memory.

Tokens/s counts generated tokens: each live sequence's growth in num_tokens since the previous
snapshot (a sequence seen for the first time adds what it generated beyond its prompt). A
sequence that starts and finishes between two snapshots (~0.1 s apart) is missed, so the figure
can read slightly low; it is the rate the map shows, measured on the GUI's clock.

The rate is taken over at least `rate_window_s` and at least MIN_RATE_STEPS snapshot changes:
on a slow machine one step can outlast any fixed window, and a window with no new snapshot in
it would read 0 tokens/s while every sequence is decoding.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from kvscope.engine.kv.snapshot import KVSnapshot

GIB = 1 << 30
MIN_RATE_STEPS = 4  # the rate window spans at least this many snapshot changes
MAX_RATE_WINDOW_S = 60.0  # ... but no more than this: an idle engine reads 0 after a minute


@dataclass
class Memory:
    """What the memory tile and plot show, read tolerantly from DeviceMemory.to_dict()."""

    headline: str
    detail: str
    used_gib: float  # device memory used by all processes; NaN without a GPU
    process_gib: float  # this process: on the GPU (NVML or torch), else its RSS
    tooltip: str


def _gib(value: object) -> float:
    return value / GIB if isinstance(value, (int, float)) else math.nan


def read_memory(device_memory: dict | None) -> Memory:
    """Headline figures from `engine.memory.device_memory.DeviceMemory.to_dict()`; tolerant of
    gaps."""
    dm = device_memory or {}
    gpus = [g for g in dm.get("gpus") or () if isinstance(g, dict)]
    rss = _gib(dm.get("process_rss_bytes"))
    tips = []
    for g in gpus:
        tips.append(
            f"GPU {g.get('index', '?')} {g.get('name', '?')}: {_gib(g.get('used_bytes')):.2f} of "
            f"{_gib(g.get('total_bytes')):.2f} GiB used, this process "
            f"{_gib(g.get('process_bytes')):.2f}"
        )
        if g.get("torch_allocated_bytes") is not None:
            tips.append(
                f"  torch allocated {_gib(g.get('torch_allocated_bytes')):.2f} GiB, reserved "
                f"{_gib(g.get('torch_reserved_bytes')):.2f} GiB"
            )
    if not math.isnan(rss):
        tips.append(f"process RSS {rss:.2f} GiB")
    if gpus:
        used = sum(_gib(g.get("used_bytes")) for g in gpus)
        total = sum(_gib(g.get("total_bytes")) for g in gpus)
        mine = sum(_gib(g.get("process_bytes")) for g in gpus)
        if math.isnan(mine):  # NVML may not list this process; torch's own figure then
            mine = sum(_gib(g.get("torch_reserved_bytes")) for g in gpus)
        name = gpus[0].get("name") or "GPU"
        more = f" +{len(gpus) - 1}" if len(gpus) > 1 else ""
        return Memory(
            f"{used:.1f} / {total:.0f} GiB",
            f"{name}{more} · this process {mine:.2f} GiB",
            used,
            mine,
            "\n".join(tips),
        )
    error = dm.get("nvml_error")
    if error:
        tips.append(f"NVML: {error}")
    headline = f"RSS {rss:.2f} GiB" if not math.isnan(rss) else "–"
    return Memory(headline, "CPU · no NVIDIA GPU", math.nan, rss, "\n".join(tips) or headline)


class TrafficCounter:
    """Generated tokens and prefix lookups over time, sampled once per update."""

    def __init__(self, rate_window_s: float = 3.0, prefix_window_s: float = 10.0) -> None:
        self.rate_window_s = rate_window_s
        self.prefix_window_s = prefix_window_s
        self.generated_tokens = 0
        self._seen: dict[int, int] = {}  # seq id -> num_tokens at the previous snapshot
        self._last: KVSnapshot | None = None
        self._changes: deque[float] = deque(maxlen=MIN_RATE_STEPS + 1)  # new-snapshot times
        self._history: deque[tuple[float, int, int, int]] = deque()  # t, generated, hits, queries

    def update(self, now: float, snapshot: KVSnapshot | None, stats: dict) -> None:
        if snapshot is not None and snapshot is not self._last:
            self._last = snapshot
            self._changes.append(now)
            seen = {}
            for s in snapshot.sequences:
                before = self._seen.get(s.seq_id)
                start = s.num_prompt_tokens if before is None else before
                self.generated_tokens += max(0, s.num_tokens - start)
                seen[s.seq_id] = s.num_tokens
            self._seen = seen
        hits = int(stats.get("prefix_cache_hit_tokens", 0) or 0)
        queries = int(stats.get("prefix_cache_query_tokens", 0) or 0)
        self._history.append((now, self.generated_tokens, hits, queries))
        horizon = now - max(MAX_RATE_WINDOW_S, self.prefix_window_s) - 1.0
        while len(self._history) > 2 and self._history[1][0] < horizon:
            self._history.popleft()

    def _since(self, now: float, window: float) -> tuple[float, int, int, int]:
        return next((h for h in self._history if h[0] >= now - window), self._history[-1])

    @property
    def rate_window(self) -> float:
        """Seconds the rate is taken over: rate_window_s, or MIN_RATE_STEPS typical gaps
        between snapshot changes when steps are slower. While sequences run, the gap since the
        last change counts too: the step under way is at least that long."""
        changes = list(self._changes)
        gaps = [b - a for a, b in zip(changes, changes[1:], strict=False)]
        typical = statistics.median(gaps) if gaps else 0.0
        if changes and self._last is not None and self._last.metrics.num_running:
            typical = max(typical, self._history[-1][0] - changes[-1])
        return min(MAX_RATE_WINDOW_S, max(self.rate_window_s, MIN_RATE_STEPS * typical))

    @property
    def tokens_per_s(self) -> float:
        if len(self._history) < 2:
            return 0.0
        now, generated = self._history[-1][:2]
        t0, g0, _, _ = self._since(now, self.rate_window)
        return (generated - g0) / (now - t0) if now - t0 > 0.05 else 0.0

    @property
    def recent_prefix_hit_rate(self) -> float:
        """Hit share of the prompt tokens looked up in the last prefix_window_s; NaN if none."""
        if not self._history:
            return math.nan
        now, _, hits, queries = self._history[-1]
        _, _, h0, q0 = self._since(now, self.prefix_window_s)
        return (hits - h0) / (queries - q0) if queries > q0 else math.nan
