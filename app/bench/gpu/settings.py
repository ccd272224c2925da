"""GpuBenchSettings: the grid `kvscope bench --gpu` runs, in its own module so that the kernel
and engine halves of the GPU bench (kernel_timing, engine_decode) can type it without importing the
bench that imports them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class GpuBenchSettings:
    out: Path = Path("bench_out")
    kernel_batches: tuple[int, ...] = (1, 4, 16, 64)
    kernel_contexts: tuple[int, ...] = (512, 2048, 8192)
    kernel_heads: tuple[int, int, int] = (32, 8, 128)  # query heads, KV heads, head dim
    kernel_iters: int = 20
    kernel_warmup: int = 3
    engine_batches: tuple[int, ...] = (1, 8, 64)
    engine_contexts: tuple[int, ...] = (512, 2048, 8192)
    decode_steps: int = 32
    warmup_steps: int = 4
    block_size: int = 16
