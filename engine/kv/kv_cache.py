"""The physical KV pool: one preallocated tensor holding every layer's K and V blocks.

An fp8 pool (float8_e4m3fn) stores K/V divided by a float32 scale per layer and KV head and holds
twice the blocks of a 16-bit pool in the same bytes. The scales start at 1 and are set once, before
serving, by `engine.model.kv_calibration.calibrate_kv_scales`.

With a `KVLayout` of several groups (sliding-window and full layers), a block holds the K/V of
`layout.group_size` layers, one group's: the tensor has that many layer slots and layer i reads
and writes slot `layout.placement()[i][1]` of the blocks its group's table names. Without one,
every layer has its own slot (one group of all layers).
"""

from __future__ import annotations

import torch

from kvscope.engine.kv.layout import KVLayout


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
        layout: KVLayout | None = None,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.layout = layout or KVLayout.single(num_layers, block_size)
        if self.layout.block_size != block_size:
            raise ValueError(f"layout block size {self.layout.block_size} is not {block_size}")
        # layer -> (group, slot in the block)
        self.placement = self.layout.placement()
        if len(self.placement) != num_layers:
            raise ValueError(
                f"layout places {len(self.placement)} layers, the model has {num_layers}"
            )
        # One allocation for the whole pool; layers index views of it. Zeroed, not `empty`: the
        # kernels mask slots past a sequence's end, which needs them finite, and touching every
        # page now keeps first-write page faults out of the decode steps.
        self.data = torch.zeros(
            (self.layout.group_size, 2, num_blocks, block_size, num_kv_heads, head_dim),
            dtype=dtype,
            device=device,
        )
        self.is_fp8 = dtype == torch.float8_e4m3fn
        # [layer, K/V, kv_head]; only an fp8 pool uses them.
        self.scales = (
            torch.ones((num_layers, 2, num_kv_heads), dtype=torch.float32, device=device)
            if self.is_fp8
            else None
        )

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        slot = self.placement[index][1]
        return self.data[slot, 0], self.data[slot, 1]

    def group_of(self, layer: int) -> int:
        """The KV group whose block tables layer `layer` reads."""
        return self.placement[layer][0]

    def layer_scales(self, index: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(k_scale, v_scale), each [num_kv_heads] float32, or (None, None) for a 16/32-bit pool."""
        if self.scales is None:
            return None, None
        return self.scales[index, 0], self.scales[index, 1]

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks (every layer slot, K and V) from src to dst: copy-on-write."""
        if pairs:
            src = torch.tensor([s for s, _ in pairs], device=self.data.device)
            dst = torch.tensor([d for _, d in pairs], device=self.data.device)
            # Bytes, so float8 pools copy the same way (CPU torch lacks float8 index kernels).
            data = self.data.view(torch.uint8) if self.is_fp8 else self.data
            data[:, :, dst] = data[:, :, src]

    @property
    def nbytes(self) -> int:
        scale_bytes = 0 if self.scales is None else self.scales.numel() * 4
        return self.data.numel() * self.data.element_size() + scale_bytes

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """Bytes of one block holding `num_layers` layers (a layout's group_size)."""
        elem = torch.empty((), dtype=dtype).element_size()  # float8: 1 byte
        return 2 * num_layers * block_size * num_kv_heads * head_dim * elem
