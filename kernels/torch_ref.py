"""Torch reference implementations of the paged-KV kernels: the CPU path and the test oracle.

Shapes (ARCHITECTURE.md): caches are [num_blocks, block_size, num_kv_heads, head_dim]; a slot is
block_id * block_size + offset.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448


def kv_scale_per_head(scale: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """An fp8 KV scale, per tensor (one value) or per KV head, as float32 [Hkv]: the one rule
    both backends take scales by."""
    flat = scale.to(torch.float32).reshape(-1)
    if flat.numel() == 1:
        return flat.expand(num_kv_heads)
    if flat.numel() != num_kv_heads:
        raise ValueError(
            f"KV scale has {flat.numel()} values; expected 1 (per tensor) or {num_kv_heads} "
            "(per KV head)"
        )
    return flat


def _fold_scale(x: torch.Tensor, scale: torch.Tensor | None, hkv: int) -> torch.Tensor:
    """x [..., Hq, D] times its KV head's scale. Folding K's scale into q and V's into the output
    dequantizes without a multiply over the whole gathered cache: q.(k*s) == (q*s).k."""
    if scale is None:
        return x
    per_q_head = kv_scale_per_head(scale, hkv).repeat_interleave(x.shape[-2] // hkv)
    return (x.float() * per_q_head.view(-1, 1)).to(x.dtype)


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
    _store(k, k_cache, slot_mapping, k_scale)
    _store(v, v_cache, slot_mapping, v_scale)


def _store(
    x: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor, scale: torch.Tensor | None
) -> None:
    hkv, d = cache.shape[-2], cache.shape[-1]
    if scale is not None:
        x = x.float() / scale.float().view(-1, 1)
    if cache.dtype == FP8:
        # Saturate rather than overflow; CPU torch has no index_copy_ for float8, so copy bytes.
        x = x.float().clamp(-FP8_MAX, FP8_MAX).to(FP8).view(torch.uint8)
        cache = cache.view(torch.uint8)
    cache.view(-1, hkv, d).index_copy_(0, slots, x.to(cache.dtype))


def gather_kv(
    cache: torch.Tensor, block_table: torch.Tensor, length: int, start_block: int = 0
) -> torch.Tensor:
    """Tokens [start_block * block_size, length) of one sequence's K or V, contiguous:
    [length - start_block * block_size, Hkv, D]. A sliding window starts past block 0, and the
    table's entries before it may name blocks already given back (never read)."""
    bs = cache.shape[1]
    num_blocks = (length + bs - 1) // bs
    blocks = cache.index_select(0, block_table[start_block:num_blocks].long())
    return blocks.reshape(-1, cache.shape[2], cache.shape[3])[: length - start_block * bs]


def window_start(length: int, sliding_window: int | None) -> int:
    """The first key position the last of `length` tokens sees: p - W < j <= p."""
    return 0 if sliding_window is None else max(0, length - sliding_window)


def _check_window(sliding_window: int | None) -> None:
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 or None, got {sliding_window}")


def paged_decode_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """One query token per sequence attending to its paged context. Returns [B, Hq, D].

    sliding_window W: the query at position p = len - 1 sees keys p - W < j <= p only; blocks
    wholly before that are not read (their table entries may be stale). Slots past a sequence's
    length or before its window are masked out; they must hold finite values (the engine's pool
    starts zeroed), since a masked weight of exactly 0 times NaN would still be NaN."""
    _check_window(sliding_window)
    batch, hq, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    lens = seq_lens.tolist()
    max_len = max(lens)
    num_blocks = (max_len + bs - 1) // bs
    # The first block any sequence's window reaches; nothing before it is gathered.
    first_block = min(window_start(n, sliding_window) for n in lens) // bs
    base = first_block * bs
    # Gather only the blocks the longest sequence needs; shorter ones are masked below.
    # index_select on the flattened table is ~1.8x faster than k_cache[tables] on CPU.
    flat = block_tables[:, first_block:num_blocks].reshape(-1).long()
    k = k_cache.index_select(0, flat).view(batch, -1, hkv, d).to(q.dtype)
    v = v_cache.index_select(0, flat).view(batch, -1, hkv, d).to(q.dtype)
    q = _fold_scale(q, k_scale, hkv)
    if batch == 1:
        # One sequence: cut the gathered span instead of masking it (four fewer ops per layer).
        lo = window_start(max_len, sliding_window) - base
        k, v, mask = k[:, lo : max_len - base], v[:, lo : max_len - base], None
    else:
        pos = torch.arange(base, num_blocks * bs, device=q.device).view(1, -1)
        lens_col = seq_lens.view(-1, 1).to(pos.dtype)
        hidden = pos >= lens_col
        if sliding_window is not None:
            hidden |= pos < lens_col - sliding_window
        mask = torch.zeros(hidden.shape, dtype=q.dtype, device=q.device)
        mask.masked_fill_(hidden, float("-inf"))
        mask = mask.view(batch, 1, 1, -1)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.unsqueeze(2),  # [B, Hq, 1, D]
        k.transpose(1, 2),  # [B, Hkv, L, D]
        v.transpose(1, 2),
        attn_mask=mask,
        scale=scale,
        enable_gqa=hq != hkv,
    )
    return _fold_scale(out.view(batch, hq, d), v_scale, hkv)


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
    sliding_window: int | None = None,
) -> torch.Tensor:
    """New tokens (possibly after a cached prefix) attend causally to prefix + themselves.

    q is [T, Hq, D], the new tokens of all sequences back to back; sequence i owns
    q[query_start_loc[i]:query_start_loc[i+1]], and its total length (prefix + new) is seq_lens[i].
    Its K/V must already be stored in the cache. With sliding_window W the query at position p
    sees keys p - W < j <= p only, and blocks before the first query's window are not read.
    Returns [T, Hq, D].
    """
    _check_window(sliding_window)
    out = torch.empty_like(q)
    hq, hkv = q.shape[1], k_cache.shape[2]
    bs = k_cache.shape[1]
    q = _fold_scale(q, k_scale, hkv)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, total in enumerate(lens):
        q_lo, q_hi = starts[i], starts[i + 1]
        n_new = q_hi - q_lo
        first_block = window_start(total - n_new + 1, sliding_window) // bs
        base = first_block * bs
        k = gather_kv(k_cache, block_tables[i], total, first_block).to(q.dtype)
        v = gather_kv(v_cache, block_tables[i], total, first_block).to(q.dtype)
        qi = q[q_lo:q_hi].transpose(0, 1).unsqueeze(0)  # [1, Hq, n_new, D]
        ki = k.transpose(0, 1).unsqueeze(0)
        vi = v.transpose(0, 1).unsqueeze(0)
        if n_new == total and sliding_window is None:
            mask = None
            causal = True
        else:
            # Query j sits at absolute position total - n_new + j and sees keys up to it
            # (and, with a window, none W or more positions behind it).
            q_pos = torch.arange(total - n_new, total, device=q.device).view(-1, 1)
            k_pos = torch.arange(base, total, device=q.device).view(1, -1)
            mask = k_pos <= q_pos
            if sliding_window is not None:
                mask &= k_pos > q_pos - sliding_window
            causal = False
        oi = torch.nn.functional.scaled_dot_product_attention(
            qi, ki, vi, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=ki.shape[1] != hq
        )
        out[q_lo:q_hi] = oi.squeeze(0).transpose(0, 1)
    return _fold_scale(out, v_scale, hkv)
