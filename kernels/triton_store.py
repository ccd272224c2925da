"""The Triton KV store: each token's K and V into its slot of the paged cache, the GPU side of
`torch_ref.store_kv_torch`, bit for bit (fp8 included: K/V / scale, rounded to e4m3 by hand)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvscope.kernels.triton_common import cache_strides, jit, last_dim_contiguous, scale_arg


@jit
def _round_to_e4m3(x: tl.tensor) -> tl.tensor:
    """Round float32 to the nearest float8_e4m3fn value (ties to even, saturating at +-448),
    still in float32. The cast that follows is then exact: the same bits as torch's conversion on
    every backend (Triton's interpreter rounds fp8 casts without carrying into the exponent)."""
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)  # the largest finite e4m3fn
    bits = x.to(tl.int32, bitcast=True)
    # Normal range: keep 3 of float32's 23 mantissa bits, rounding half to even; a carry out of
    # the mantissa moves into the exponent, as it should.
    lsb = (bits >> 20) & 1
    normal = ((bits + 0x7FFFF + lsb) & -0x100000).to(tl.float32, bitcast=True)
    # Below 2**-6 e4m3 is subnormal, a fixed grid of 2**-9: adding 1.5 * 2**14 makes float32's
    # own round-to-nearest-even land on that grid.
    mag = tl.abs(x)
    sub = (mag + 24576.0) - 24576.0
    sub = tl.where(bits < 0, -sub, sub)  # bits, not x: keeps the sign of -0.0
    return tl.where(mag < 0.015625, sub, normal)


@jit
def _store_kv_kernel(
    k_ptr: tl.tensor,
    v_ptr: tl.tensor,
    k_cache_ptr: tl.tensor,
    v_cache_ptr: tl.tensor,
    slot_ptr: tl.tensor,
    k_scale_ptr: tl.tensor,
    v_scale_ptr: tl.tensor,
    stride_kt: tl.tensor,
    stride_kh: tl.tensor,
    stride_vt: tl.tensor,
    stride_vh: tl.tensor,
    stride_kcb: tl.tensor,
    stride_kcs: tl.tensor,
    stride_kch: tl.tensor,
    stride_vcb: tl.tensor,
    stride_vcs: tl.tensor,
    stride_vch: tl.tensor,
    num_kv_heads: tl.tensor,
    block_size: tl.tensor,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_K_SCALE: tl.constexpr,
    HAS_V_SCALE: tl.constexpr,
    FP8: tl.constexpr,
) -> None:
    """One program per token: every KV head of its K and V into its slot (-1: padding, skip)."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    block = slot // block_size
    offset = slot % block_size
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < num_kv_heads) & (d[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask).to(
        tl.float32
    )
    v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask).to(
        tl.float32
    )
    if HAS_K_SCALE:
        k = k / tl.load(k_scale_ptr + h, mask=h < num_kv_heads, other=1.0)[:, None]
    if HAS_V_SCALE:
        v = v / tl.load(v_scale_ptr + h, mask=h < num_kv_heads, other=1.0)[:, None]
    if FP8:
        k = _round_to_e4m3(k)
        v = _round_to_e4m3(v)
    k_dst = block * stride_kcb + offset * stride_kcs + h[:, None] * stride_kch + d[None, :]
    v_dst = block * stride_vcb + offset * stride_vcs + h[:, None] * stride_vch + d[None, :]
    tl.store(k_cache_ptr + k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv_triton(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Like `store_kv_torch`: token t's K/V into flat slot slot_mapping[t], -1 skipped."""
    num_tokens, hkv, d = k.shape
    if num_tokens == 0:
        return
    k, v = last_dim_contiguous(k), last_dim_contiguous(v)
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        scale_arg(k_scale, hkv, k),
        scale_arg(v_scale, hkv, v),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        *cache_strides(k_cache),
        *cache_strides(v_cache),
        hkv,
        k_cache.shape[1],
        HEAD_DIM=d,
        BLOCK_H=triton.next_power_of_2(hkv),
        BLOCK_D=triton.next_power_of_2(d),
        HAS_K_SCALE=k_scale is not None,
        HAS_V_SCALE=v_scale is not None,
        FP8=k_cache.dtype == torch.float8_e4m3fn,
    )
