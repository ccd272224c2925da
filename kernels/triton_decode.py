"""Triton paged decode attention: one new token per sequence against its whole cached context,
the GPU side of `torch_ref.paged_decode_attention_torch`.

One program per (sequence, KV head) serves the KV head's whole group of query heads, so GQA reads
each K/V tile once per group. Long contexts at small batch would leave most SMs idle, so decode
can split the context (split-K): each program then covers one partition and writes a partial
output with its log2-sum-exp, and a second kernel merges a sequence's partitions.
"""

from __future__ import annotations

import functools

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

# Split-K: below this many context tokens one program per (sequence, KV head) is cheap enough
# that a second reduce launch costs more than the parallelism it buys.
SPLIT_MIN_CONTEXT = 1024
SPLIT_MIN_PARTITION = 256  # tokens per split: shorter partitions are dominated by the reduce
SPLIT_MAX = 64


@jit
def _decode_kernel(
    q_ptr: tl.tensor,
    k_cache_ptr: tl.tensor,
    v_cache_ptr: tl.tensor,
    block_tables_ptr: tl.tensor,
    seq_lens_ptr: tl.tensor,
    k_scale_ptr: tl.tensor,
    v_scale_ptr: tl.tensor,
    out_ptr: tl.tensor,
    lse_ptr: tl.tensor,
    qk_scale: tl.tensor,
    stride_qb: tl.tensor,
    stride_qh: tl.tensor,
    stride_kcb: tl.tensor,
    stride_kcs: tl.tensor,
    stride_kch: tl.tensor,
    stride_vcb: tl.tensor,
    stride_vcs: tl.tensor,
    stride_vch: tl.tensor,
    stride_bt: tl.tensor,
    stride_ob: tl.tensor,
    stride_oh: tl.tensor,
    stride_os: tl.tensor,
    stride_lb: tl.tensor,
    stride_lh: tl.tensor,
    block_size: tl.tensor,
    group: tl.tensor,
    partition_size: tl.tensor,
    window: tl.tensor,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_K_SCALE: tl.constexpr,
    HAS_V_SCALE: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
) -> None:
    """Program (sequence b, KV head, split s): every query head of the KV head's group against
    context tokens [lo + s * partition_size, lo + (s + 1) * partition_size) of sequence b, where
    lo = max(0, seq_len - window) is the first token its sliding window sees (0 without one):
    blocks before it are never read.

    Without SPLIT the one partition is the whole context and the output is final; with SPLIT
    each program writes its normalized partial output and log2-sum-exp, which
    `_decode_reduce_kernel` merges.
    """
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    start = tl.maximum(seq_len - window, 0) + split * partition_size
    end = tl.minimum(seq_len, start + partition_size)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv_head * group + g
    g_mask = g < group
    d_mask = d < HEAD_DIM
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    scale = fold_kv_scale(qk_scale, k_scale_ptr, kv_head, HAS_K_SCALE)

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    table = block_tables_ptr + b * stride_bt
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        valid = pos < end
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
            valid[None, :],
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
    # An empty split (past this sequence's end) has l_i == 0; the reduce never reads it.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :]
    if SPLIT:
        out_ptrs += split * stride_os
        lse = m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0))
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=g_mask)
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])


@jit
def _decode_reduce_kernel(
    partial_ptr: tl.tensor,
    lse_ptr: tl.tensor,
    seq_lens_ptr: tl.tensor,
    out_ptr: tl.tensor,
    stride_pb: tl.tensor,
    stride_ph: tl.tensor,
    stride_ps: tl.tensor,
    stride_lb: tl.tensor,
    stride_lh: tl.tensor,
    stride_ob: tl.tensor,
    stride_oh: tl.tensor,
    partition_size: tl.tensor,
    window: tl.tensor,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
) -> None:
    """Program (sequence, query head): merge the sequence's non-empty splits by their lse."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b)
    num_splits = tl.cdiv(seq_len - tl.maximum(seq_len - window, 0), partition_size)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    m = float("-inf")
    total = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s in range(0, num_splits):
        lse = tl.load(lse_ptr + b * stride_lb + h * stride_lh + s)
        part = tl.load(
            partial_ptr + b * stride_pb + h * stride_ph + s * stride_ps + d, mask=d_mask, other=0.0
        )
        m_new = tl.maximum(m, lse)
        alpha = tl.exp2(m - m_new)
        w = tl.exp2(lse - m_new)
        acc = acc * alpha + part * w
        total = total * alpha + w
        m = m_new
    tl.store(
        out_ptr + b * stride_ob + h * stride_oh + d,
        (acc / total).to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


def device_sm_count(device: torch.device) -> int:
    """The device's SM count, what `decode_num_splits` sizes the launch by."""
    if device.type == "cuda":
        return _cuda_sm_count(device.index if device.index is not None else 0)
    return 8  # the interpreter has no SMs; a small number keeps the heuristic testable


@functools.cache
def _cuda_sm_count(index: int) -> int:
    count: int = torch.cuda.get_device_properties(index).multi_processor_count
    return count


def decode_num_splits(batch: int, num_kv_heads: int, max_context: int, num_sms: int) -> int:
    """How many partitions split-K decode cuts each sequence's context into (1 = no split).

    Decode launches one program per (sequence, KV head). When that is fewer than two programs per
    SM the GPU idles while each program walks its whole context, so long contexts are cut into
    partitions of >= SPLIT_MIN_PARTITION tokens until there are about 2 x SMs programs; short
    contexts (< SPLIT_MIN_CONTEXT) and large batches never split.
    """
    programs = batch * num_kv_heads
    if max_context < SPLIT_MIN_CONTEXT or programs >= 2 * num_sms:
        return 1
    wanted: int = triton.cdiv(2 * num_sms, programs)
    return max(1, min(wanted, max_context // SPLIT_MIN_PARTITION, SPLIT_MAX))


def paged_decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sliding_window: int | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Like `paged_decode_attention_torch`; `num_splits` None picks split-K by heuristic.

    The context bound comes from the block table's width (no device-to-host sync for max(seq_lens));
    with a sliding window the span split-K partitions is at most the window.
    """
    window = window_arg(sliding_window)
    batch, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    group = gqa_group(hq, hkv)
    q = last_dim_contiguous(q)
    block_n = 64 if q.element_size() <= 2 else 32
    max_context = min(block_tables.shape[1] * block_size, window)
    if num_splits is None:
        num_splits = decode_num_splits(batch, hkv, max_context, device_sm_count(q.device))
    partition = triton.cdiv(triton.cdiv(max_context, num_splits), block_n) * block_n
    num_splits = triton.cdiv(max_context, partition)
    out = torch.empty_like(q)
    if num_splits > 1:
        partial = torch.empty((batch, hq, num_splits, d), dtype=torch.float32, device=q.device)
        lse = torch.empty((batch, hq, num_splits), dtype=torch.float32, device=q.device)
        target, o_strides = partial, (partial.stride(0), partial.stride(1), partial.stride(2))
        l_strides = (lse.stride(0), lse.stride(1))
    else:
        lse = None
        target, o_strides, l_strides = out, (out.stride(0), out.stride(1), 0), (0, 0)
    _decode_kernel[(batch, hkv, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        scale_arg(k_scale, hkv, q),
        scale_arg(v_scale, hkv, q),
        target,
        target if lse is None else lse,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        *cache_strides(k_cache),
        *cache_strides(v_cache),
        block_tables.stride(0),
        *o_strides,
        *l_strides,
        block_size,
        group,
        partition,
        window,
        HEAD_DIM=d,
        BLOCK_D=triton.next_power_of_2(d),
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n,
        HAS_K_SCALE=k_scale is not None,
        HAS_V_SCALE=v_scale is not None,
        SPLIT=num_splits > 1,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=4,
    )
    if lse is not None:
        _decode_reduce_kernel[(batch, hq)](
            partial,
            lse,
            seq_lens,
            out,
            *o_strides,
            *l_strides,
            out.stride(0),
            out.stride(1),
            partition,
            window,
            HEAD_DIM=d,
            BLOCK_D=triton.next_power_of_2(d),
            num_warps=4,
        )
    return out
