"""The What-if tab's arithmetic, no Qt: log-scaled slider positions, what a sweep varies and over
which values, and the figures a sweep plots.

The pool is bytes (as the engine sizes it: a budget, then as many blocks of the layout's size as
fit), so its slider runs from one block of the recorded layout to four times the recorded pool;
the sweeps keep every other knob at the what-if's current value and vary one.
"""

from __future__ import annotations

import dataclasses
import math

from kvscope.engine.config import BLOCK_SIZES
from kvscope.engine.trace import TraceSettings
from kvscope.engine.whatif import SimConfig, SweepPoint, WhatIf

MIB = 1 << 20
SLIDER_STEPS = 1000  # positions of a log-scaled slider
POOL_SPAN = 4.0  # the pool slider's top: this many times the recorded pool
RATE_MIN, RATE_MAX = 0.5, 4.0  # arrival rate: x0.5 .. x4, log scale
RATE_STEPS = 60  # x0.5 * 2^(i/20): x1 at 20, x2 at 40
SWEEP_POOL_LOW, SWEEP_POOL_HIGH = 128 * MIB, 4 << 30
SWEEP_MAX_BLOCKS = 1 << 16  # a pool sweep stays under this many blocks a point
SWEEP_POINTS = 12
SWEEP_RATES = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0)
SWEEP_SEQS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)

# knob -> (label, axis title): what the sweep's combo offers
SWEEPS = {
    "kv_pool": ("Pool size", "KV pool (MiB)"),
    "block_size": ("Block size", "block size (tokens)"),
    "max_num_seqs": ("Max sequences", "max_num_seqs"),
    "max_model_len": ("Max model length", "max_model_len (tokens)"),
    "rate_scale": ("Arrival rate", "arrivals (x recorded)"),
}
# summary field -> plot title: what a sweep plots against its knob
SWEEP_FIGURES = (
    ("preemptions", "Preemptions"),
    ("peak_running", "Peak concurrency"),
    ("mean_wait_s", "Mean wait (s)"),
    ("p95_ttft_s", "p95 TTFT (s, modelled)"),
)


def log_value(position: int, low: float, high: float, steps: int = SLIDER_STEPS) -> float:
    """A slider position in [0, steps] as a value between low and high on a log scale."""
    if high <= low:
        return low
    return low * (high / low) ** (min(max(position, 0), steps) / steps)


def log_position(value: float, low: float, high: float, steps: int = SLIDER_STEPS) -> int:
    """The inverse of log_value, clamped to the slider's ends."""
    if high <= low or value <= low:
        return 0
    return min(steps, round(steps * math.log(value / low) / math.log(high / low)))


def pool_range(recorded: SimConfig) -> tuple[int, int]:
    """The pool slider's ends in bytes: one recorded block, four recorded pools."""
    return recorded.bytes_per_block, max(
        recorded.bytes_per_block, int(POOL_SPAN * recorded.pool_bytes)
    )


def mib_decimals(bytes_per_block: int) -> int:
    """Decimals of MiB that tell one block from the next (1 to 4)."""
    block_mib = bytes_per_block / MIB
    return min(4, max(1, math.ceil(-math.log10(block_mib)) + 1 if block_mib < 1 else 1))


def rate_of(position: int) -> float:
    return RATE_MIN * 2 ** (min(max(position, 0), RATE_STEPS) / 20)


def rate_position(rate: float) -> int:
    return min(RATE_STEPS, max(0, round(20 * math.log2(rate / RATE_MIN))))


def has_sliding_layers(settings: TraceSettings) -> bool:
    return any(w is not None for w in settings.layer_windows)


def knob_value(knob: str, config: SimConfig) -> float:
    """Where a run sits on a sweep's axis: its pool in MiB, or the knob's own value."""
    if knob == "kv_pool":
        return config.pool_bytes / MIB
    return float(getattr(config, knob))


def sweep_values(knob: str, settings: TraceSettings, recorded: SimConfig) -> list:
    """The values a sweep of `knob` runs: ~8-20 of them, inside what resolve() accepts."""
    if knob == "kv_pool":
        block, pool = recorded.bytes_per_block, recorded.pool_bytes
        # A pool recorded under 512 MiB (a small model, a test) sweeps from a quarter of it,
        # and one under 128 MiB up to 16 times it, not to 4 GiB: thousands of its pools.
        low = max(block, min(SWEEP_POOL_LOW, pool // 4))
        high = SWEEP_POOL_HIGH if pool >= SWEEP_POOL_LOW else min(SWEEP_POOL_HIGH, 16 * pool)
        high = max(min(high, SWEEP_MAX_BLOCKS * block), 2 * low)
        steps = SWEEP_POINTS - 1
        return sorted({int(log_value(i, low, high, steps)) for i in range(SWEEP_POINTS)})
    if knob == "block_size":
        return list(BLOCK_SIZES)
    if knob == "max_num_seqs":
        top = max(64, 2 * settings.max_num_seqs)
        return sorted({v for v in SWEEP_SEQS if v <= top} | {settings.max_num_seqs})
    if knob == "max_model_len":
        low, high = min(64, settings.model_context), settings.model_context
        values = {round(log_value(i, low, high, 11)) for i in range(12)}
        return sorted(values | {settings.max_model_len})
    if knob == "rate_scale":
        return list(SWEEP_RATES)
    raise ValueError(f"no sweep of {knob!r}; one of {sorted(SWEEPS)}")


def sweep_whatifs(knob: str, values: list, current: WhatIf) -> list[WhatIf]:
    """The current what-if with `knob` set to each value (a pool as bytes, not blocks)."""
    if knob == "kv_pool":
        return [dataclasses.replace(current, kv_pool=value, num_blocks=None) for value in values]
    return [dataclasses.replace(current, **{knob: value}) for value in values]


def sweep_x(knob: str, point: SweepPoint) -> float:
    """A sweep point's place on the knob's axis (the pool in MiB)."""
    value = getattr(point.what, knob)
    return value / MIB if knob == "kv_pool" else float(value)
