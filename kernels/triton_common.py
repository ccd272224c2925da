"""What the Triton kernels share: for the attention kernels (decode, prefill) the online-softmax
tile over the paged cache and the fp8 scale fold; for every launcher (the quantized matmul's too)
the argument checks and conversions and whether Triton runs interpreted.

Every attention kernel reads the cache through the block table one token tile at a time (token ->
block id -> slot), so any block size works with tiles big enough for `tl.dot`. Block ids are
widened to int64 before they meet a stride: a pool of a few GiB overflows int32 element offsets.
Softmax runs online in base 2 (`exp2`, so the launchers pass `scale * LOG2E`), float32
throughout; fp8 caches are dequantized on load by folding the per-KV-head scale into the scores
(K) and the output (V) rather than into every element. A sliding window W (query p sees keys
p - W < j <= p) starts the walk at the first tile the window reaches, so blocks wholly before
it are never read, and masks within.

With TRITON_INTERPRET=1 set before this module is imported, the kernels run on CPU tensors in
Triton's interpreter: that is how the tests check them on machines without a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from kvscope.kernels.torch_ref import kv_scale_per_head

if TYPE_CHECKING:
    from triton.runtime.jit import JITFunction

LOG2E = math.log2(math.e)
# The window the kernels take for full attention: wider than any context, and small enough that
# position arithmetic with it stays in int32.
NO_WINDOW = 2**30

# `triton.jit`, typed (triton ships no type information, so mypy takes the decorator as untyped):
# a JITFunction, launched as kernel[grid](...), or an InterpretedFunction under TRITON_INTERPRET=1.
# Triton reads the kernels' annotations: `tl.constexpr` marks a compile-time argument; `tl.tensor`,
# what a runtime argument is inside a kernel, specializes as no annotation does (a type name such
# as `int` or `float` would fix the argument's type instead).
jit: Callable[[Callable[..., object]], JITFunction | InterpretedFunction] = triton.jit


def window_arg(sliding_window: int | None) -> int:
    """A sliding window as the kernels take it (a runtime int; full attention is NO_WINDOW)."""
    if sliding_window is None:
        return NO_WINDOW
    if not 1 <= sliding_window <= NO_WINDOW:
        raise ValueError(
            f"sliding_window must be in [1, {NO_WINDOW}] or None, got {sliding_window}"
        )
    return int(sliding_window)


@jit
def fold_kv_scale(
    x: tl.tensor, scale_ptr: tl.tensor, kv_head: tl.tensor, HAS_SCALE: tl.constexpr
) -> tl.tensor:
    """x times KV head `kv_head`'s fp8 scale, or x itself without one: K's scale folds into the
    scores' scale, V's into the output."""
    if HAS_SCALE:
        x = x * tl.load(scale_ptr + kv_head)
    return x


@jit
def attend_kv_tile(
    q: tl.tensor,
    acc: tl.tensor,
    m_i: tl.tensor,
    l_i: tl.tensor,
    k_cache_ptr: tl.tensor,
    v_cache_ptr: tl.tensor,
    table: tl.tensor,
    pos: tl.tensor,
    valid: tl.tensor,
    visible: tl.tensor,
    block_size: tl.tensor,
    kv_head: tl.tensor,
    stride_kcb: tl.tensor,
    stride_kcs: tl.tensor,
    stride_kch: tl.tensor,
    stride_vcb: tl.tensor,
    stride_vcs: tl.tensor,
    stride_vch: tl.tensor,
    d: tl.tensor,
    d_mask: tl.tensor,
    scale: tl.tensor,
    DOT_PRECISION: tl.constexpr,
) -> tuple[tl.tensor, tl.tensor, tl.tensor]:
    """One online-softmax step: the query rows `q` [ROWS, BLOCK_D] against the context tokens
    `pos` [BLOCK_N] of one sequence (`table`: its block table row) in KV head `kv_head`.
    Returns the running (acc, m_i, l_i).

    `valid` says which tokens exist (the rest are not loaded), `visible` which scores count
    (broadcast against [ROWS, BLOCK_N]; causal masking lives there). `scale` carries log2(e), so
    the running max m_i and sum l_i are in base 2."""
    block = tl.load(table + pos // block_size, mask=valid, other=0).to(tl.int64)
    offset = pos % block_size
    kv_mask = valid[:, None] & d_mask[None, :]
    k_off = block * stride_kcb + offset * stride_kcs + kv_head * stride_kch
    k = tl.load(k_cache_ptr + k_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION) * scale
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row that has seen no visible key yet (a sliding window starts past this tile for it)
    # keeps m = -inf; subtract 0 instead, or -inf - -inf would turn its sums into NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v_off = block * stride_vcb + offset * stride_vcs + kv_head * stride_vch
    v = tl.load(v_cache_ptr + v_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
    return acc, m_new, l_i


# True when TRITON_INTERPRET=1 was set before import: the kernels then take CPU tensors.
INTERPRETED = isinstance(fold_kv_scale, InterpretedFunction)


def gqa_group(num_q_heads: int, num_kv_heads: int) -> int:
    """Query heads per KV head; a ValueError where they do not divide."""
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    return num_q_heads // num_kv_heads


def scale_arg(scale: torch.Tensor | None, num_kv_heads: int, like: torch.Tensor) -> torch.Tensor:
    """A KV scale as the kernels read it, float32 [Hkv]; without one, `like` stands in for the
    pointer (the kernel's HAS_*_SCALE is False and never reads it)."""
    if scale is None:
        return like
    return kv_scale_per_head(scale, num_kv_heads).contiguous()


def last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    """x itself when its rows are contiguous (the kernels take any other stride), else a copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot`'s input_precision for operands of `dtype`."""
    # float32 models keep float32 products; TF32 would cost them ~3 decimal digits.
    return "ieee" if dtype == torch.float32 else "tf32"


def cache_strides(cache: torch.Tensor) -> tuple[int, int, int]:
    """A cache's (block, slot, head) strides; its head dimension must be contiguous."""
    if cache.stride(-1) != 1:
        raise ValueError("KV cache's head dimension must be contiguous (stride 1)")
    return cache.stride(0), cache.stride(1), cache.stride(2)
