"""Triton versions of the paged-KV kernels: the GPU path, same signatures as `torch_ref`.

Every kernel reads the cache through the block table one token tile at a time (token -> block id
-> slot), so any block size works with tiles big enough for `tl.dot`. Block ids are widened to
int64 before they meet a stride: a pool of a few GiB overflows int32 element offsets. Softmax
runs online in base 2 (`exp2`), float32 throughout; fp8 caches are dequantized on load by folding
the per-KV-head scale into the scores (K) and the output (V) rather than into every element.

With TRITON_INTERPRET=1 set before this module is imported, the same kernels run on CPU tensors
in Triton's interpreter: that is how the tests check them on machines without a GPU.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

LOG2E = math.log2(math.e)
# Split-K (decode): below this many context tokens one program per (sequence, KV head) is
# cheap enough that a second reduce launch costs more than the parallelism it buys.
SPLIT_MIN_CONTEXT = 1024
SPLIT_MIN_PARTITION = 256  # tokens per split: shorter partitions are dominated by the reduce
SPLIT_MAX = 64


@triton.jit
def _round_to_e4m3(x):
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


# ---- store ------------------------------------------------------------------------------------
@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    k_scale_ptr,
    v_scale_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    num_kv_heads,
    block_size,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_K_SCALE: tl.constexpr,
    HAS_V_SCALE: tl.constexpr,
    FP8: tl.constexpr,
):
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


# ---- decode -----------------------------------------------------------------------------------
@triton.jit
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    k_scale_ptr,
    v_scale_ptr,
    out_ptr,
    lse_ptr,
    qk_scale,
    stride_qb,
    stride_qh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    stride_bt,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    block_size,
    group,
    partition_size,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_K_SCALE: tl.constexpr,
    HAS_V_SCALE: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program (sequence b, KV head, split s): every query head of the KV head's group against
    context tokens [s * partition_size, (s + 1) * partition_size) of sequence b.

    The group's query heads share each K/V tile they load (GQA: K/V are read once per group, not
    once per query head). Without SPLIT the one partition is the whole context and the output is
    final; with SPLIT each program writes its normalized partial output and log2-sum-exp, which
    `_decode_reduce_kernel` merges.
    """
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    start = split * partition_size
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
    scale = qk_scale
    if HAS_K_SCALE:
        scale = scale * tl.load(k_scale_ptr + kv_head)

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    table = block_tables_ptr + b * stride_bt
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        valid = pos < end
        block = tl.load(table + pos // block_size, mask=valid, other=0).to(tl.int64)
        offset = pos % block_size
        kv_mask = valid[:, None] & d_mask[None, :]
        k_off = block * stride_kcb + offset * stride_kcs + kv_head * stride_kch
        k = tl.load(k_cache_ptr + k_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION) * scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_off = block * stride_vcb + offset * stride_vcs + kv_head * stride_vch
        v = tl.load(v_cache_ptr + v_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(
            p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION
        )
        m_i = m_new

    if HAS_V_SCALE:
        acc = acc * tl.load(v_scale_ptr + kv_head)
    # An empty split (past this sequence's end) has l_i == 0; the reduce never reads it.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :]
    if SPLIT:
        out_ptrs += split * stride_os
        lse = m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0))
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=g_mask)
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])


@triton.jit
def _decode_reduce_kernel(
    partial_ptr,
    lse_ptr,
    seq_lens_ptr,
    out_ptr,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    partition_size,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program (sequence, query head): merge the sequence's non-empty splits by their lse."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b)
    num_splits = tl.cdiv(seq_len, partition_size)
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


# ---- prefill / extend -------------------------------------------------------------------------
@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    k_scale_ptr,
    v_scale_ptr,
    out_ptr,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    stride_bt,
    stride_ot,
    stride_oh,
    block_size,
    group,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_K_SCALE: tl.constexpr,
    HAS_V_SCALE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program (sequence b, query head h, tile m): BLOCK_M of b's new tokens, which sit after a
    cached prefix of seq_len - n_new tokens, attend causally to everything up to themselves.

    The new tokens' own K/V are already in the cache, so prefix and new keys are one loop over
    the block table; the loop stops at the tile's last query position (causal skip)."""
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
    scale = qk_scale
    if HAS_K_SCALE:
        scale = scale * tl.load(k_scale_ptr + kv_head)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    end = tl.minimum(seq_len, prefix + (tile + 1) * BLOCK_M)
    for n0 in range(0, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        valid = pos < end
        block = tl.load(table + pos // block_size, mask=valid, other=0).to(tl.int64)
        offset = pos % block_size
        kv_mask = valid[:, None] & d_mask[None, :]
        k_off = block * stride_kcb + offset * stride_kcs + kv_head * stride_kch
        k = tl.load(k_cache_ptr + k_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION) * scale
        # Every row sees key 0 (q_pos >= 0), so no row is all -inf after the first tile.
        s = tl.where(valid[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_off = block * stride_vcb + offset * stride_vcs + kv_head * stride_vch
        v = tl.load(v_cache_ptr + v_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(
            p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION
        )
        m_i = m_new

    if HAS_V_SCALE:
        acc = acc * tl.load(v_scale_ptr + kv_head)
    out = acc / l_i[:, None]
    tl.store(
        out_ptr + tokens[:, None] * stride_ot + h * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_mask[:, None] & d_mask[None, :],
    )


# ---- launchers --------------------------------------------------------------------------------
# True when TRITON_INTERPRET=1 was set before import: the kernels then take CPU tensors.
INTERPRETED = isinstance(_store_kv_kernel, InterpretedFunction)


def _per_head(scale: torch.Tensor | None, num_kv_heads: int, like: torch.Tensor) -> torch.Tensor:
    """A scale as float32 [Hkv] (a per-tensor scalar is broadcast); `like` stands in if None."""
    if scale is None:
        return like
    flat = scale.to(torch.float32).reshape(-1)
    if flat.numel() == 1:
        return flat.expand(num_kv_heads).contiguous()
    if flat.numel() != num_kv_heads:
        raise ValueError(
            f"KV scale has {flat.numel()} values; expected 1 (per tensor) or {num_kv_heads} "
            "(per KV head)"
        )
    return flat.contiguous()


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _dot_precision(dtype: torch.dtype) -> str:
    # float32 models keep float32 products; TF32 would cost them ~3 decimal digits.
    return "ieee" if dtype == torch.float32 else "tf32"


def _cache_strides(cache: torch.Tensor) -> tuple[int, int, int]:
    if cache.stride(-1) != 1:
        raise ValueError("KV cache's head dimension must be contiguous (stride 1)")
    return cache.stride(0), cache.stride(1), cache.stride(2)


def device_sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return _cuda_sm_count(device.index if device.index is not None else 0)
    return 8  # the interpreter has no SMs; a small number keeps the heuristic testable


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


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
    wanted = triton.cdiv(2 * num_sms, programs)
    return max(1, min(wanted, max_context // SPLIT_MIN_PARTITION, SPLIT_MAX))


def store_kv_triton(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    num_tokens, hkv, d = k.shape
    if num_tokens == 0:
        return
    k, v = _last_dim_contiguous(k), _last_dim_contiguous(v)
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        _per_head(k_scale, hkv, k),
        _per_head(v_scale, hkv, v),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        *_cache_strides(k_cache),
        *_cache_strides(v_cache),
        hkv,
        k_cache.shape[1],
        HEAD_DIM=d,
        BLOCK_H=triton.next_power_of_2(hkv),
        BLOCK_D=triton.next_power_of_2(d),
        HAS_K_SCALE=k_scale is not None,
        HAS_V_SCALE=v_scale is not None,
        FP8=fp8,
    )


def paged_decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Like `paged_decode_attention_torch`; `num_splits` None picks split-K by heuristic.

    The context bound comes from the block table's width (no device-to-host sync for max(seq_lens)).
    """
    batch, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    if hq % hkv:
        raise ValueError(f"{hq} query heads are not a multiple of {hkv} KV heads")
    q = _last_dim_contiguous(q)
    group = hq // hkv
    block_n = 64 if q.element_size() <= 2 else 32
    max_context = block_tables.shape[1] * block_size
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
        _per_head(k_scale, hkv, q),
        _per_head(v_scale, hkv, q),
        target,
        target if lse is None else lse,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        *_cache_strides(k_cache),
        *_cache_strides(v_cache),
        block_tables.stride(0),
        *o_strides,
        *l_strides,
        block_size,
        group,
        partition,
        HEAD_DIM=d,
        BLOCK_D=triton.next_power_of_2(d),
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n,
        HAS_K_SCALE=k_scale is not None,
        HAS_V_SCALE=v_scale is not None,
        SPLIT=num_splits > 1,
        DOT_PRECISION=_dot_precision(q.dtype),
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
            HEAD_DIM=d,
            BLOCK_D=triton.next_power_of_2(d),
            num_warps=4,
        )
    return out


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
) -> torch.Tensor:
    """Like `paged_prefill_attention_torch`. The grid's tile axis is sized for the longest
    possible sequence (every other one has >= 1 new token): programs past their sequence's
    tokens return at once, and no device-to-host sync is needed to size the launch."""
    num_tokens, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    if hq % hkv:
        raise ValueError(f"{hq} query heads are not a multiple of {hkv} KV heads")
    q = _last_dim_contiguous(q)
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
        _per_head(k_scale, hkv, q),
        _per_head(v_scale, hkv, q),
        out,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        *_cache_strides(k_cache),
        *_cache_strides(v_cache),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        block_size,
        hq // hkv,
        HEAD_DIM=d,
        BLOCK_D=triton.next_power_of_2(d),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        HAS_K_SCALE=k_scale is not None,
        HAS_V_SCALE=v_scale is not None,
        DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=4,
    )
    return out
