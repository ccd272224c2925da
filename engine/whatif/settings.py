"""What a what-if may change, and what that comes to against the recorded settings.

`WhatIf` holds the knobs a user turns (None: as recorded); `resolve` turns them into the pool
and limits a simulation runs under. The pool keeps its bytes unless told otherwise: block size
32 over a recorded pool of 1,456 blocks of 16 is 728 blocks of the same memory, and an fp8 KV
cache over a bfloat16 one holds twice the blocks, as the engine's planner would size them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from kvscope.engine.config import ALLOCATORS, BLOCK_SIZES
from kvscope.engine.kv.kv_cache import KVCache
from kvscope.engine.kv.layout import KVLayout
from kvscope.engine.kv.replay import MAX_REPLAY_BLOCKS
from kvscope.engine.memory.byte_units import format_binary, parse_bytes
from kvscope.engine.memory.device_memory import system_memory
from kvscope.engine.trace.records import TraceSettings

# What `kv_dtype` takes: as recorded, or a KV cache of this element type.
KV_DTYPES = {
    "auto": None,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "fp8": torch.float8_e4m3fn,
}
# Arrivals up to 100x as fast or as slow: a slower what-if stretches the trace's span by as
# much (1e-300 once printed a 300-digit span).
MIN_RATE_SCALE, MAX_RATE_SCALE = 0.01, 100.0
# A simulated pool's blocks, each ~324 bytes in the paged allocator (3 in the contiguous one)
# at 10^6 blocks, and the block map's telemetry of them (~80): one figure for both allocators.
SIM_BYTES_PER_BLOCK = 400
# The most a what-if simulates wherever it runs: the most a recording replays (1.7x the largest
# real pool), ~6.3 GiB of simulation.
MAX_SIM_BLOCKS = MAX_REPLAY_BLOCKS
# The knobs that count something: a given value is used as it is (0 is not "as recorded").
COUNT_KNOBS = ("num_blocks", "block_size", "max_num_seqs", "max_model_len", "max_batched_tokens")


class SimulationTooLarge(ValueError):
    """A pool larger than this machine can simulate: refused before it is built."""


@dataclass(frozen=True)
class WhatIf:
    """The knobs of a what-if; None keeps the recorded value."""

    kv_pool: int | None = None  # bytes of KV pool
    num_blocks: int | None = None  # or the pool as a block count (wins over kv_pool)
    block_size: int | None = None
    kv_dtype: str = "auto"
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    max_batched_tokens: int | None = None
    prefix_caching: bool | None = None
    allocator: str | None = None
    honour_windows: bool | None = None  # sliding-window layers give their blocks back
    rate_scale: float = 1.0  # arrivals this many times as fast (same requests, same order)

    @classmethod
    def from_text(cls, values: dict[str, str]) -> WhatIf:
        """From `name=value` text (the command line's --set); ValueError names the bad one."""
        known = {f.name: f for f in fields(cls)}
        aliases = {"kv_pool_bytes": "kv_pool", "prefix_cache": "prefix_caching"}
        out: dict[str, Any] = {}  # each value of its own knob's type (_parse)
        for raw_name, text in values.items():
            name = aliases.get(raw_name, raw_name)
            if name not in known:
                raise ValueError(f"unknown what-if setting {raw_name!r}; one of {sorted(known)}")
            out[name] = _parse(name, text.strip())
        what = cls(**out)
        what.check()
        return what

    def check(self) -> None:
        """ValueError for a value no recording makes sense of: a count below 1, an arrival
        rate out of range (NaN included)."""
        for name in COUNT_KNOBS:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} {value:,} is not a count: it must be >= 1")
        if not MIN_RATE_SCALE <= self.rate_scale <= MAX_RATE_SCALE:
            raise ValueError(
                f"rate_scale {self.rate_scale:g} is not in [{MIN_RATE_SCALE:g}, {MAX_RATE_SCALE:g}]"
            )

    def describe(self) -> str:
        """The knobs that differ from the recording, e.g. 'block_size=32, kv_pool=256 MiB'."""
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            if f.name == "kv_pool":
                value = format_binary(value)
            parts.append(f"{f.name}={value}")
        return ", ".join(parts) or "as recorded"


@dataclass(frozen=True)
class SimConfig:
    """The concrete settings one simulation runs under."""

    num_blocks: int
    block_size: int
    kv_dtype: str  # torch dtype name
    bytes_per_block: int
    max_num_seqs: int
    max_model_len: int
    max_batched_tokens: int
    enable_prefix_caching: bool
    allocator: str
    release_window_blocks: bool
    rate_scale: float
    layer_windows: tuple[int | None, ...]

    @property
    def pool_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    def layout(self) -> KVLayout:
        honour = self.allocator == "paged" and self.release_window_blocks
        return KVLayout.for_windows(self.layer_windows, self.block_size, honour_windows=honour)


def recorded_config(recorded: TraceSettings) -> SimConfig:
    return resolve(recorded, WhatIf())


def resolve(recorded: TraceSettings, what: WhatIf) -> SimConfig:
    """The settings `what` comes to over a recording made under `recorded`."""
    what.check()
    block_size = _given(what.block_size, recorded.block_size)
    if block_size not in BLOCK_SIZES:
        raise ValueError(f"block_size {block_size} is not one of {BLOCK_SIZES}")
    allocator = what.allocator or recorded.allocator
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator {allocator!r} is not one of {ALLOCATORS}")
    if what.kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype {what.kv_dtype!r} is not one of {tuple(KV_DTYPES)}")
    dtype = KV_DTYPES[what.kv_dtype] or getattr(torch, recorded.kv_dtype)
    release = recorded.release_window_blocks if what.honour_windows is None else what.honour_windows
    base = SimConfig(
        num_blocks=recorded.num_blocks,
        block_size=recorded.block_size,
        kv_dtype=recorded.kv_dtype,
        bytes_per_block=0,
        max_num_seqs=recorded.max_num_seqs,
        max_model_len=recorded.max_model_len,
        max_batched_tokens=recorded.max_batched_tokens,
        enable_prefix_caching=recorded.enable_prefix_caching,
        allocator=recorded.allocator,
        release_window_blocks=recorded.release_window_blocks,
        rate_scale=1.0,
        layer_windows=recorded.layer_windows,
    )
    recorded_bytes = recorded.num_blocks * _block_bytes(
        base, recorded, getattr(torch, recorded.kv_dtype)
    )
    config = replace(
        base,
        block_size=block_size,
        kv_dtype=str(dtype).removeprefix("torch."),
        allocator=allocator,
        release_window_blocks=release,
        enable_prefix_caching=(
            recorded.enable_prefix_caching if what.prefix_caching is None else what.prefix_caching
        ),
        max_num_seqs=_given(what.max_num_seqs, recorded.max_num_seqs),
        max_model_len=_given(what.max_model_len, recorded.max_model_len),
        max_batched_tokens=_given(what.max_batched_tokens, recorded.max_batched_tokens),
        rate_scale=what.rate_scale,
    )
    per_block = _block_bytes(config, recorded, dtype)
    if what.num_blocks is not None:
        num_blocks = what.num_blocks
    else:
        num_blocks = (what.kv_pool if what.kv_pool is not None else recorded_bytes) // per_block
    config = replace(config, num_blocks=num_blocks, bytes_per_block=per_block)
    pool = what.kv_pool if what.kv_pool is not None else recorded_bytes
    if what.num_blocks is not None:
        check_simulated_pool(num_blocks, f"num_blocks {num_blocks:,}")
    else:
        named = (
            f"kv_pool {format_binary(pool)}" if what.kv_pool is not None else "the recorded pool"
        )
        check_simulated_pool(num_blocks, f"{named} ({num_blocks:,} blocks)")
    if num_blocks < 1:
        raise ValueError(
            f"a KV pool of {format_binary(pool)} holds no block of {format_binary(per_block)} "
            f"({config.block_size} tokens, {config.kv_dtype})"
        )
    _check(config, recorded)
    return config


def simulated_pool_limit(simultaneous: int = 1) -> tuple[int, str]:
    """The most blocks a what-if simulates here, `simultaneous` pools at once, and why."""
    available = system_memory()[1]
    if available is not None:
        by_memory = available // (SIM_BYTES_PER_BLOCK * simultaneous)
        if by_memory < MAX_SIM_BLOCKS:
            each = f" each of {simultaneous} at once" if simultaneous > 1 else ""
            return by_memory, (
                f"a simulated block takes ~{SIM_BYTES_PER_BLOCK} B{each}, and this machine has "
                f"{format_binary(available)} available"
            )
    return MAX_SIM_BLOCKS, "the most a recording of any real pool replays"


def check_simulated_pool(num_blocks: int, named: str, simultaneous: int = 1) -> None:
    """SimulationTooLarge, naming the value (`named`) and the limit, for a pool of more blocks
    than this machine can simulate: the engine's own fit check, against host memory."""
    limit, why = simulated_pool_limit(simultaneous)
    if num_blocks > limit:
        need = format_binary(num_blocks * SIM_BYTES_PER_BLOCK * simultaneous)
        raise SimulationTooLarge(
            f"{named} is more than a what-if simulates here: at most {limit:,} blocks ({why}); "
            f"this one would take ~{need}"
        )


def _given(value: int | None, recorded: int) -> int:
    return recorded if value is None else value


def _block_bytes(config: SimConfig, recorded: TraceSettings, dtype: torch.dtype) -> int:
    return KVCache.bytes_per_block(
        config.layout().group_size,
        config.block_size,
        recorded.num_kv_heads,
        recorded.head_dim,
        dtype,
    )


def _check(config: SimConfig, recorded: TraceSettings) -> None:
    if not 2 <= config.max_model_len <= recorded.model_context:
        raise ValueError(
            f"max_model_len {config.max_model_len:,} is not in [2, {recorded.model_context:,}] "
            "(the model's context)"
        )
    if config.max_num_seqs < 1 or config.max_batched_tokens < 1:
        raise ValueError("max_num_seqs and max_batched_tokens must be >= 1")


def _parse(name: str, text: str) -> int | str | bool | float:
    if name == "kv_pool":
        return parse_bytes(text)
    if name in ("kv_dtype", "allocator"):
        return text
    if name in ("prefix_caching", "honour_windows"):
        if text.lower() in ("1", "true", "on", "yes"):
            return True
        if text.lower() in ("0", "false", "off", "no"):
            return False
        raise ValueError(f"{name} takes on or off, got {text!r}")
    if name == "rate_scale":
        try:
            return float(text.lower().removeprefix("x").removesuffix("x"))
        except ValueError:
            raise ValueError(f"rate_scale takes a number such as 0.5 or 2, got {text!r}") from None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} takes a whole number, got {text!r}") from None


def cost_caveat(recorded: TraceSettings, config: SimConfig) -> str:
    """What these settings change in a step's cost that the cost model cannot know, fitted as
    it is to the recording's own steps ("" when nothing): the KV dtype. Block size and the
    allocator move no cost worth a term (bench --whatif: block size 32's busy time was modelled
    +2.6% and +10.8% off in two runs, whose as-recorded rows were -2.0% and -9.2% off)."""
    if config.kv_dtype == recorded.kv_dtype:
        return ""

    def name(dtype: str) -> str:
        return "fp8" if dtype == "float8_e4m3fn" else dtype

    line = (
        f"Step times come from the recording (its {name(recorded.kv_dtype)} KV cache): the cost "
        f"model has no term for the KV dtype, so the {name(config.kv_dtype)} cache's own cost "
        "is not in them."
    )
    cpu_bf16 = recorded.device.startswith("cpu") and recorded.kv_dtype == "bfloat16"
    if config.kv_dtype == "float8_e4m3fn" and cpu_bf16:  # the fused path reads bfloat16 only
        # Measured on a 2-core Xeon, bundled model: 42 ms a step against 17 ms at 4 decoding
        # sequences; in kvscope bench --whatif the real fp8 run fell behind its arrivals (14
        # running at its peak against 5) and its steps averaged 77 ms against 12.5.
        line += (
            " On a CPU an fp8 cache takes the engine off its fused decode path (torch runs "
            "the whole step): expect its steps to take several times as long."
        )
    return line
