"""Split-K of the Triton decode kernel, for the GPU bench: the split count the kernel's heuristic
picks for a shape, and a decode call with the count fixed.

The public kernels leave split-K to the kernel (the engine never chooses it), but the bench
reports the choice and times "split off" beside it; this is the one place above kernels/ that
reaches the decode module. Triton is imported on the first call, so a CPU-only machine can import
this file without it.
"""

from __future__ import annotations

import torch


def heuristic_num_splits(
    batch: int, num_kv_heads: int, max_context: int, device: torch.device
) -> int:
    """Partitions the decode kernel cuts each context into for this shape on `device`."""
    from kvscope.kernels import triton_decode

    sms = triton_decode.device_sm_count(device)
    return triton_decode.decode_num_splits(batch, num_kv_heads, max_context, sms)


def decode_with_splits(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    *,
    num_splits: int,
) -> torch.Tensor:
    """`kernels.paged_decode_attention(..., backend="triton")` with the context cut into
    `num_splits` partitions (1: no split); the arguments as that function takes them."""
    from kvscope.kernels import triton_decode

    return triton_decode.paged_decode_attention_triton(
        q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale, v_scale, num_splits=num_splits
    )
