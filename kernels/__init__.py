"""Paged-KV kernels, each twice: Triton (`triton_store`, `triton_decode`, `triton_prefill`, sharing
`triton_common`) and a torch reference (`torch_ref`).

Every public kernel takes `backend`:
  "auto"   Triton for CUDA tensors (when triton is installed), torch otherwise. The engine uses it.
  "torch"  the reference: any device, the CPU path and the test oracle.
  "triton" Triton explicitly: CUDA tensors, or CPU tensors when TRITON_INTERPRET=1 was set before
           the first kernel call (Triton's interpreter; how the tests run the kernels without GPU).

Caches are [num_blocks, block_size, num_kv_heads, head_dim] per layer, in the model's dtype or
float8_e4m3fn. With fp8, `k_scale` / `v_scale` (float32, [num_kv_heads] or one per tensor) divide
K/V on store and multiply them back on load. Decode attention picks split-K (partitioned context
plus a reduce kernel) for long contexts at small batch; see `triton_decode.decode_num_splits`.

`quantized_matmul(x, w)` is x @ W.T for a weight in the packed `QuantizedTensor` format
(`quant_format`): Triton dequantizes W inside the GEMM (`triton_quant`); the torch reference
dequantizes a few rows at a time and multiplies densely. "auto" falls back to the reference for
a layout the Triton kernel does not take (see `triton_quant.supports`).

Triton is imported on the first Triton call, not here: a CPU machine never needs it.
"""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType

import torch

from kvscope.kernels.quant_format import QuantizedTensor, quantized_matmul_torch
from kvscope.kernels.torch_ref import (
    paged_decode_attention_torch,
    paged_prefill_attention_torch,
    store_kv_torch,
)

__all__ = [
    "paged_decode_attention",
    "paged_prefill_attention",
    "quantized_matmul",
    "store_kv",
]

_BACKENDS = ("auto", "torch", "triton")


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


@functools.cache
def _triton(module: str) -> ModuleType:
    """kvscope.kernels.<module>, a Triton module, imported on first use (once triton was found)."""
    return importlib.import_module(f"{__name__}.{module}")


def resolve_backend(backend: str, tensor: torch.Tensor) -> str:
    """The backend that will run for `tensor`: "torch" or "triton"."""
    if backend not in _BACKENDS:
        raise ValueError(f"kernel backend {backend!r} is not one of {_BACKENDS}")
    if backend == "torch":
        return "torch"
    if backend == "auto":
        return "triton" if tensor.is_cuda and _triton_installed() else "torch"
    if not _triton_installed():
        raise ValueError("kernel backend 'triton' needs the triton package, which is not installed")
    if not tensor.is_cuda and not _triton("triton_common").INTERPRETED:
        raise ValueError(
            f"kernel backend 'triton' needs CUDA tensors, got {tensor.device}; on CPU it runs only "
            "in Triton's interpreter (TRITON_INTERPRET=1 set before the first kernel call)"
        )
    return "triton"


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    backend: str = "auto",
) -> None:
    """Token t's K and V ([T, Hkv, D]) into flat slot slot_mapping[t]; -1 marks padding."""
    if resolve_backend(backend, k) == "triton":
        _triton("triton_store").store_kv_triton(
            k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale
        )
    else:
        store_kv_torch(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    backend: str = "auto",
    sliding_window: int | None = None,
) -> torch.Tensor:
    """One query token per sequence (q [B, Hq, D]) against its paged context -> [B, Hq, D].

    sliding_window W (None = full attention): the query at position p attends to keys
    p - W < j <= p; table entries for blocks wholly before that are never read."""
    impl = (
        _triton("triton_decode").paged_decode_attention_triton
        if resolve_backend(backend, q) == "triton"
        else paged_decode_attention_torch
    )
    return impl(
        q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale, v_scale, sliding_window
    )


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    backend: str = "auto",
    sliding_window: int | None = None,
) -> torch.Tensor:
    """New tokens (q [T, Hq, D], sequences back to back) attending causally to their cached
    prefix and themselves -> [T, Hq, D]; see `paged_prefill_attention_torch`. sliding_window as
    in `paged_decode_attention`."""
    impl = (
        _triton("triton_prefill").paged_prefill_attention_triton
        if resolve_backend(backend, q) == "triton"
        else paged_prefill_attention_torch
    )
    return impl(
        q,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        scale,
        k_scale,
        v_scale,
        sliding_window,
    )


def quantized_matmul(x: torch.Tensor, w: QuantizedTensor, backend: str = "auto") -> torch.Tensor:
    """x [M, K] @ W.T -> [M, N] in x's dtype, W a `QuantizedTensor` [N, K]."""
    if resolve_backend(backend, x) == "triton":
        tq = _triton("triton_quant")
        if backend == "triton" or tq.supports(w):
            y: torch.Tensor = tq.quantized_matmul_triton(x, w)
            return y
    return quantized_matmul_torch(x, w)
