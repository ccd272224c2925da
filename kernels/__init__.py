"""Paged-KV kernels. Each has a torch reference; `backend="auto"` dispatches on the tensor's device.

Triton versions run on CUDA tensors once they land; until then every backend resolves to torch.
"""

from __future__ import annotations

import torch

from kernels.torch_ref import (
    paged_decode_attention_torch,
    paged_prefill_attention_torch,
    store_kv_torch,
)

__all__ = ["paged_decode_attention", "paged_prefill_attention", "store_kv", "resolve_backend"]

_BACKENDS = ("auto", "torch")


def resolve_backend(backend: str, tensor: torch.Tensor) -> str:
    if backend not in _BACKENDS:
        raise ValueError(f"kernel backend {backend!r} is not one of {_BACKENDS}")
    return "torch"


def store_kv(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None, backend="auto"):
    resolve_backend(backend, k)
    store_kv_torch(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def paged_decode_attention(
    q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale=None, v_scale=None, backend="auto"
):
    resolve_backend(backend, q)
    return paged_decode_attention_torch(
        q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale, v_scale
    )


def paged_prefill_attention(
    q,
    k_cache,
    v_cache,
    block_tables,
    query_start_loc,
    seq_lens,
    scale,
    k_scale=None,
    v_scale=None,
    backend="auto",
):
    resolve_backend(backend, q)
    return paged_prefill_attention_torch(
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, k_scale, v_scale
    )
