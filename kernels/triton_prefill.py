"""Triton paged prefill / extend attention: a chunk of new tokens per sequence, after a cached
prefix, attending causally to prefix and themselves; the GPU side of
`torch_ref.paged_prefill_attention_torch`.

The new tokens' own K/V are already in the cache when this runs, so prefix and new keys are one
walk over the block table, the same online-softmax tile as decode with a causal mask on top.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvscope.kernels.triton_common import (
    LOG2E,
    attend_kv_tile,
    cache_strides,
    dot_precision,
    fold_kv_scale,
    gqa_group,
    jit,
    last_dim_contiguous,
    scale_arg,
    window_arg,
)


@jit
def _prefill_kernel(
    q_ptr: tl.tensor,
    k_cache_ptr: tl.tensor,
    v_cache_ptr: tl.tensor,
    block_tables_ptr: tl.tensor,
    query_start_loc_ptr: tl.tensor,
    seq_lens_ptr: tl.tensor,
    k_scale_ptr: tl.tensor,
    v_scale_ptr: tl.tensor,
    out_ptr: tl.tensor,
    qk_scale: tl.tensor,
    stride_qt: tl.tensor,
    stride_qh: tl.tensor,
    stride_kcb: tl.tensor,
    stride_kcs: tl.tensor,
    stride_kch: tl.tensor,
    stride_vcb: tl.tensor,
    stride_vcs: tl.tensor,
    stride_vch: tl.tensor,
    stride_bt: tl.tensor,
    stride_ot: tl.tensor,
    stride_oh: tl.tensor,
    block_size: tl.tensor,
    group: tl.tensor,
    window: tl.tensor,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_K_SCALE: tl.constexpr,
    HAS_V_SCALE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
) -> None:
    """Program (sequence b, query head h, tile m): BLOCK_M of b's new tokens, which sit after a
    cached prefix of seq_len - n_new tokens, attend causally to everything up to themselves.

    The walk over the block table stops at the tile's last query position (causal skip) and,
    with a sliding window, starts at the first key the tile's first query sees (window skip)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    tile = tl.program_id(2)
    q_lo = tl.load(query_start_loc_ptr + b)
    n_new = tl.load(query_start_loc_ptr + b + 1) - q_lo
    if tile * BLOCK_M >= n_new:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    prefix = seq_len - n_new
    kv_head = h // group

    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_new
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    tokens = (q_lo + rows).to(tl.int64)
    q = tl.load(
        q_ptr + tokens[:, None] * stride_qt + h * stride_qh + d[None, :],
        mask=row_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    q_pos = prefix + rows
    scale = fold_kv_scale(qk_scale, k_scale_ptr, kv_head, HAS_K_SCALE)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    end = tl.minimum(seq_len, prefix + (tile + 1) * BLOCK_M)
    lo = tl.maximum(prefix + tile * BLOCK_M - window + 1, 0)
    for n0 in range(lo, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        valid = pos < end
        # Every row sees its own key at the latest; rows that see nothing in an earlier tile
        # (the window) are kept finite by attend_kv_tile.
        causal = (
            valid[None, :]
            & (pos[None, :] <= q_pos[:, None])
            & (pos[None, :] > q_pos[:, None] - window)
        )
        acc, m_i, l_i = attend_kv_tile(
            q,
            acc,
            m_i,
            l_i,
            k_cache_ptr,
            v_cache_ptr,
            table,
            pos,
            valid,
            causal,
            block_size,
            kv_head,
            stride_kcb,
            stride_kcs,
            stride_kch,
            stride_vcb,
            stride_vcs,
            stride_vch,
            d,
            d_mask,
            scale,
            DOT_PRECISION,
        )

    acc = fold_kv_scale(acc, v_scale_ptr, kv_head, HAS_V_SCALE)
    # Padding rows (past n_new) may see no key at all under a window: 0 / 1, never stored.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + tokens[:, None] * stride_ot + h * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_mask[:, None] & d_mask[None, :],
    )


def paged_prefill_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Like `paged_prefill_attention_torch`. The grid's tile axis is sized for the longest
    possible sequence (every other one has >= 1 new token): programs past their sequence's
    tokens return at once, and no device-to-host sync is needed to size the launch."""
    window = window_arg(sliding_window)
    num_tokens, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    group = gqa_group(hq, hkv)
    q = last_dim_contiguous(q)
    out = torch.empty_like(q)
    batch = seq_lens.shape[0]
    if num_tokens == 0:
        return out
    small = q.element_size() <= 2
    block_m, block_n = (64, 64) if small else (32, 32)
    max_new = num_tokens - batch + 1
    _prefill_kernel[(batch, hq, triton.cdiv(max_new, block_m))](
        q,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        scale_arg(k_scale, hkv, q),
        scale_arg(v_scale, hkv, q),
        out,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        *cache_strides(k_cache),
        *cache_strides(v_cache),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        block_size,
        group,
        window,
        HEAD_DIM=d,
        BLOCK_D=triton.next_power_of_2(d),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        HAS_K_SCALE=k_scale is not None,
        HAS_V_SCALE=v_scale is not None,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=4,
    )
    return out
