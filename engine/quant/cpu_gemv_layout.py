"""Quantized weights in kernels/cpu_gemv.py's layout (K-major column chunks, codes in tiles),
built from the packed format chunk by chunk, with no second copy of the codes kept."""

from __future__ import annotations

import numpy as np

from kernels import cpu_gemv
from kernels.quant_format import QuantizedTensor


def gemv_layout(w: QuantizedTensor) -> cpu_gemv.QuantizedCodesT:
    """`w` transposed into column chunks; 8-bit codes centred (see kernels/cpu_gemv.py)."""
    # cpu_layout's numpy readers of the packed format; imported here, as cpu_layout imports us.
    from engine.quant.cpu_layout import _codes as codes_of
    from engine.quant.cpu_layout import _group_scales as group_scales_of

    n, k = w.shape
    g = w.group_size
    chunks, width = cpu_gemv.chunking(n)
    scale = np.zeros((chunks, k // g, width), np.float32)
    low = np.zeros_like(scale)
    tile = cpu_gemv.tile_width(width, w.bits)
    tiles = width // tile
    if w.bits == 4:
        codes = np.zeros((chunks, k // 32, tiles, 16, tile), np.uint8)
        centre, run = 0, cpu_gemv.nibble_run()
    else:
        codes = np.zeros((chunks, k // 8, tiles, 8, tile), np.int8)
        top = int(w.codes.max())
        centre = _symmetric_centre(w)
        if centre is None:
            centre = (top + 1) // 2  # codes become code - centre: |code| <= centre
        run = cpu_gemv.int8_run(max(centre, top - centre))  # >= 2: the kernel sums pairs
    for c in range(chunks):
        rows = slice(c * width, min(n, (c + 1) * width))
        count = rows.stop - rows.start
        if count <= 0:
            continue
        if w.bits == 4:
            t = np.zeros((k // 2, width), np.uint8)
            t[:, :count] = w.codes[rows].numpy().T  # byte j: elements 2j, 2j + 1
            # [K/32 groups, 16 byte rows, tiles, 16 columns] -> group, tile, byte row, column
            codes[c] = t.reshape(k // 32, 16, tiles, tile).transpose(0, 2, 1, 3)
        else:
            t = np.zeros((k, width), np.int8)
            t[:, :count] = (codes_of(w, rows).astype(np.int16) - centre).astype(np.int8).T
            codes[c] = t.reshape(k // 8, 8, tiles, tile).transpose(0, 2, 1, 3)
        s, m = group_scales_of(w, rows)
        scale[c, :, :count] = s.T
        low[c, :, :count] = (m + centre * s).T
    if w.kind in cpu_gemv.HALF_KINDS:
        half_scale, half_low = _as_half_bits(scale), _as_half_bits(low)
        if half_scale is not None and half_low is not None:
            scale, low = half_scale, half_low
    return cpu_gemv.QuantizedCodesT(codes, scale, low, g, w.bits, run, n)


def _symmetric_centre(w: QuantizedTensor) -> int | None:
    """c where every group's offset is -c times its scale (Q5_0: 16, Q8_0: 128): centring the
    codes on it makes low exactly 0, a float16 (centring on the codes in use would not)."""
    if w.sub_scale is not None or w.sub_min is not None:
        return None
    d, offset = w.d.float().numpy(), -w.dmin.float().numpy()
    scaled = d != 0  # an all-zero group says nothing about c
    if not scaled.any():
        return None
    centre = int(round(float(offset[scaled][0] / d[scaled][0])))
    if centre <= 0 or not np.array_equal(offset, centre * d):
        return None
    return centre


def _as_half_bits(values: np.ndarray) -> np.ndarray | None:
    """float32 values as float16 bits (uint16), or None where one of them is not a float16."""
    half = values.astype(np.float16)
    if not np.array_equal(half.astype(np.float32), values):
        return None
    return half.view(np.uint16)
