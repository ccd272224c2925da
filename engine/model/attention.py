"""What one forward step's attention needs to know: the flat tensors the kernels consume."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvscope import kernels


@dataclass
class AttentionMetadata:
    """Tokens are laid out decodes first (one per sequence), then prefill chunks back to back."""

    slot_mapping: torch.Tensor  # [T] int64, flat cache slot of each new token
    num_decode_tokens: int
    decode_block_tables: torch.Tensor | None  # [Bd, M] int32
    decode_seq_lens: torch.Tensor | None  # [Bd] int32, context length incl. the new token
    prefill_block_tables: torch.Tensor | None  # [Bp, M] int32
    prefill_query_start_loc: torch.Tensor | None  # [Bp + 1] int32
    prefill_seq_lens: torch.Tensor | None  # [Bp] int32, prefix + new tokens

    @classmethod
    def single_prefill(
        cls, num_tokens: int, block_size: int, device: torch.device
    ) -> AttentionMetadata:
        """One sequence of `num_tokens` new tokens in blocks 0, 1, ... of a scratch pool (the
        profile and calibration runs at engine build)."""
        num_blocks = -(-num_tokens // block_size)
        return cls(
            slot_mapping=torch.arange(num_tokens, device=device),
            num_decode_tokens=0,
            decode_block_tables=None,
            decode_seq_lens=None,
            prefill_block_tables=torch.arange(num_blocks, dtype=torch.int32, device=device)[None],
            prefill_query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32, device=device),
            prefill_seq_lens=torch.tensor([num_tokens], dtype=torch.int32, device=device),
        )


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Store this step's K/V into the pool, then attend through block tables. Returns [T, Hq, D].

    k_scale / v_scale: an fp8 pool's per-KV-head scales for this layer (None otherwise).
    sliding_window: this layer's window W (None = full attention): position p sees keys
    p - W < j <= p. The kernels run Triton on CUDA tensors and the torch reference elsewhere
    (backend "auto")."""
    kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)
    nd = meta.num_decode_tokens
    parts: list[torch.Tensor] = []
    if nd:
        # A part's (decode, prefill) tensors are None only when it has no tokens.
        assert meta.decode_block_tables is not None and meta.decode_seq_lens is not None
        parts.append(
            kernels.paged_decode_attention(
                q[:nd],
                k_cache,
                v_cache,
                meta.decode_block_tables,
                meta.decode_seq_lens,
                scale,
                k_scale,
                v_scale,
                sliding_window=sliding_window,
            )
        )
    if nd < q.shape[0]:
        # Likewise for the prefill part.
        assert meta.prefill_block_tables is not None
        assert meta.prefill_query_start_loc is not None and meta.prefill_seq_lens is not None
        parts.append(
            kernels.paged_prefill_attention(
                q[nd:],
                k_cache,
                v_cache,
                meta.prefill_block_tables,
                meta.prefill_query_start_loc,
                meta.prefill_seq_lens,
                scale,
                k_scale,
                v_scale,
                sliding_window=sliding_window,
            )
        )
    return parts[0] if len(parts) == 1 else torch.cat(parts)
