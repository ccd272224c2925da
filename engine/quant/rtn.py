"""Round-to-nearest weight quantization of float checkpoints (`quantization="int8"/"int4"`).

Asymmetric, one float16 scale and offset per group of GROUP_SIZE input features: codes are
round((w - min) / scale) with scale = (max - min) / (2**bits - 1), computed against the float16
scale and offset that are stored, so dequantizing gives the nearest grid point the format can
represent. No calibration data, no outlier handling: the simple baseline that keeps a float
checkpoint's weights at a quarter (int8: about half) of their 16-bit size.
"""

from __future__ import annotations

import torch

from kvscope.kernels.quant_format import QuantizedTensor

GROUP_SIZE = 128
ROW_CHUNK_ELEMENTS = 1 << 24  # float32 scratch per step: 64 MiB


def quantize_rtn(w: torch.Tensor, bits: int, group_size: int = GROUP_SIZE) -> QuantizedTensor:
    """[N, K] float -> QuantizedTensor (CPU). K must be a multiple of group_size."""
    if bits not in (4, 8):
        raise ValueError(f"round-to-nearest quantization takes 4 or 8 bits, got {bits}")
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"in_features {k} is not a multiple of the group size {group_size}")
    top = (1 << bits) - 1
    codes = torch.empty((n, k // 2 if bits == 4 else k), dtype=torch.uint8)
    d = torch.empty((n, k // group_size), dtype=torch.float32)
    dmin = torch.empty_like(d)
    step = max(1, ROW_CHUNK_ELEMENTS // k)
    for start in range(0, n, step):
        rows = slice(start, min(n, start + step))
        g = w[rows].float().reshape(-1, k // group_size, group_size)
        low, high = g.amin(-1), g.amax(-1)
        scale = ((high - low) / top).half().float()
        low = low.half().float()
        inv = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
        q = ((g - low[..., None]) * inv[..., None]).round_().clamp_(0, top).to(torch.uint8)
        q = q.reshape(q.shape[0], k)
        codes[rows] = (q[:, 0::2] | (q[:, 1::2] << 4)) if bits == 4 else q
        d[rows], dmin[rows] = scale, low
    store = (
        torch.float16
        if torch.isfinite(d.half()).all() and torch.isfinite(dmin.half()).all()
        else torch.float32
    )
    return QuantizedTensor(
        shape=(n, k),
        bits=bits,
        group_size=group_size,
        super_group_size=group_size,
        codes=codes,
        d=d.to(store),
        dmin=dmin.to(store),
        kind=f"int{bits}",
    )
