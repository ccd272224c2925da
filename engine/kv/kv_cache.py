"""The physical KV pool: one preallocated tensor holding every layer's K and V blocks."""

from __future__ import annotations

import torch


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        # One allocation for the whole pool; layers index views of it. Zeroed, not `empty`: the
        # kernels mask slots past a sequence's end, which needs them finite, and touching every
        # page now keeps first-write page faults out of the decode steps.
        self.data = torch.zeros(
            (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim),
            dtype=dtype,
            device=device,
        )

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[index, 0], self.data[index, 1]

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks (every layer, K and V) from src to dst: copy-on-write."""
        if pairs:
            src = torch.tensor([s for s, _ in pairs], device=self.data.device)
            dst = torch.tensor([d for _, d in pairs], device=self.data.device)
            self.data[:, :, dst] = self.data[:, :, src]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * elem
