"""Torch reference implementations of the paged-KV kernels: the CPU path and the test oracle.

Shapes follow DESIGN.md: caches are [num_blocks, block_size, num_kv_heads, head_dim]; a slot is
block_id * block_size + offset.
"""

from __future__ import annotations

import torch


def _dequant(cache: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    if scale is None:
        return cache.to(dtype)
    # scale is per KV head ([Hkv]) or a scalar; cache is [..., Hkv, D]
    return cache.to(dtype) * scale.to(dtype).view(-1, 1)


def store_kv_torch(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write token t's K/V into flat slot slot_mapping[t]; slots of -1 are padding and skipped."""
    valid = slot_mapping >= 0
    if not bool(valid.all()):
        k, v, slot_mapping = k[valid], v[valid], slot_mapping[valid]
    hkv, d = k_cache.shape[-2], k_cache.shape[-1]
    flat_k = k_cache.view(-1, hkv, d)
    flat_v = v_cache.view(-1, hkv, d)
    if k_scale is not None:
        k = k / k_scale.to(k.dtype).view(-1, 1)
    if v_scale is not None:
        v = v / v_scale.to(v.dtype).view(-1, 1)
    flat_k.index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    flat_v.index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens of one sequence's K or V, contiguous: [length, Hkv, D]."""
    bs = cache.shape[1]
    num_blocks = (length + bs - 1) // bs
    blocks = cache.index_select(0, block_table[:num_blocks].long())
    return blocks.reshape(-1, cache.shape[2], cache.shape[3])[:length]


def paged_decode_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per sequence attending to its whole paged context. Returns [B, Hq, D].

    Slots past a sequence's length are masked out; they must hold finite values (the engine's
    pool starts zeroed), since a masked weight of exactly 0 times NaN would still be NaN."""
    batch, hq, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    max_len = int(seq_lens.max())
    num_blocks = (max_len + bs - 1) // bs
    # Gather only the blocks the longest sequence needs; shorter ones are masked below.
    # index_select on the flattened table is ~1.8x faster than k_cache[tables] on CPU.
    flat = block_tables[:, :num_blocks].reshape(-1).long()
    k = _dequant(k_cache.index_select(0, flat).view(batch, -1, hkv, d), k_scale, q.dtype)
    v = _dequant(v_cache.index_select(0, flat).view(batch, -1, hkv, d), v_scale, q.dtype)
    if batch == 1:
        # One sequence: cut the gathered tail instead of masking it (four fewer ops per layer).
        k, v, mask = k[:, :max_len], v[:, :max_len], None
    else:
        pos = torch.arange(num_blocks * bs, device=q.device)
        past_end = pos.view(1, -1) >= seq_lens.view(-1, 1).to(pos.dtype)
        mask = torch.zeros(past_end.shape, dtype=q.dtype, device=q.device)
        mask.masked_fill_(past_end, float("-inf"))
        mask = mask.view(batch, 1, 1, -1)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.unsqueeze(2),  # [B, Hq, 1, D]
        k.transpose(1, 2),  # [B, Hkv, L, D]
        v.transpose(1, 2),
        attn_mask=mask,
        scale=scale,
        enable_gqa=hq != hkv,
    )
    return out.view(batch, hq, d)


def paged_prefill_attention_torch(
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
    """New tokens (possibly after a cached prefix) attend causally to prefix + themselves.

    q is [T, Hq, D], the new tokens of all sequences back to back; sequence i owns
    q[query_start_loc[i]:query_start_loc[i+1]], and its total length (prefix + new) is seq_lens[i].
    Its K/V must already be stored in the cache. Returns [T, Hq, D].
    """
    out = torch.empty_like(q)
    hq = q.shape[1]
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, total in enumerate(lens):
        q_lo, q_hi = starts[i], starts[i + 1]
        n_new = q_hi - q_lo
        k = _dequant(gather_kv(k_cache, block_tables[i], total), k_scale, q.dtype)
        v = _dequant(gather_kv(v_cache, block_tables[i], total), v_scale, q.dtype)
        qi = q[q_lo:q_hi].transpose(0, 1).unsqueeze(0)  # [1, Hq, n_new, D]
        ki = k.transpose(0, 1).unsqueeze(0)
        vi = v.transpose(0, 1).unsqueeze(0)
        if n_new == total:
            mask = None
            causal = True
        else:
            # Query j sits at absolute position total - n_new + j and sees keys up to it.
            q_pos = torch.arange(total - n_new, total, device=q.device).view(-1, 1)
            mask = torch.arange(total, device=q.device).view(1, -1) <= q_pos
            causal = False
        oi = torch.nn.functional.scaled_dot_product_attention(
            qi, ki, vi, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=ki.shape[1] != hq
        )
        out[q_lo:q_hi] = oi.squeeze(0).transpose(0, 1)
    return out
