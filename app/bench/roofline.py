"""Batch-1 decode roofline: every decode step streams all weights plus the KV context from memory,
so the best possible tokens/s is memory bandwidth divided by those bytes."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass
class Roofline:
    bandwidth_gb_s: float
    weight_bytes: int
    kv_bytes_per_token: float
    bytes_per_token: float
    tokens_per_s: float


def measure_read_bandwidth(num_bytes: int = 1 << 30, repeats: int = 5) -> float:
    """Best-of-`repeats` bytes/s for torch.sum over a float32 buffer, default thread count.

    1 GiB is far past the caches, so this is what the cores can pull from DRAM. Best-of, because
    on a shared machine a slower pass measures the neighbours, not the memory.
    """
    buffer = torch.ones(num_bytes // 4, dtype=torch.float32)
    buffer.sum()  # the first pass pays for page faults, not bandwidth
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * buffer.element_size() / best


def decode_roofline(bandwidth: float, weight_bytes: int, kv_bytes: float) -> Roofline:
    """`weight_bytes` should count what one step reads: with tied embeddings, lm_head once."""
    per_token = weight_bytes + kv_bytes
    return Roofline(
        bandwidth_gb_s=bandwidth / 1e9,
        weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_bytes,
        bytes_per_token=per_token,
        tokens_per_s=bandwidth / per_token,
    )
