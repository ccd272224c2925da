"""Quantized weights in kernels/cpu_gemv.py's layout (K-major column chunks, codes in tiles),
built from the packed format chunk by chunk, with no second copy of the codes kept."""

from __future__ import annotations

import numpy as np

from kvscope.engine.quant.packed_readers import codes_of, group_scales_of
from kvscope.kernels import cpu_gemv
from kvscope.kernels.quant_format import QuantizedTensor


def gemv_layout(w: QuantizedTensor) -> cpu_gemv.QuantizedCodesT:
    """`w` transposed into column chunks; 8-bit codes centred (see kernels/cpu_gemv.py)."""
    n, k = w.shape
    g = w.group_size
    chunks, width = cpu_gemv.chunking(n)
    tiles = width // cpu_gemv.TILE
    scale = np.zeros((chunks, tiles, k // g, cpu_gemv.TILE), np.float32)
    low = np.zeros_like(scale)
    a = min(g, cpu_gemv.ACT_GROUP)  # an 8-bit tile's depth: one activation group
    if w.bits == 4:
        codes = np.zeros((chunks, tiles, k // 32, 256), np.uint8)
        centre = 0
    else:
        codes = np.zeros((chunks, tiles, k // a, cpu_gemv.TILE * a), np.int8)
        top = int(w.codes.max())
        symmetric = _symmetric_centre(w)
        # codes become code - centre: |code| <= centre
        centre = (top + 1) // 2 if symmetric is None else symmetric
    for c in range(chunks):
        rows = slice(c * width, min(n, (c + 1) * width))
        count = rows.stop - rows.start
        if count <= 0:
            continue
        if w.bits == 4:
            packed = w.codes[rows].numpy()  # byte j: elements 2j, 2j + 1
            t = np.zeros((k, width), np.uint8)
            t[0::2, :count] = (packed & 15).T
            t[1::2, :count] = (packed >> 4).T
            codes[c] = _tiles4(t)
        else:
            t = np.zeros((k, width), np.int8)
            t[:, :count] = (codes_of(w, rows).astype(np.int16) - centre).astype(np.int8).T
            codes[c] = _tiles8(t, a)
        s, m = group_scales_of(w, rows)
        scale[c] = _tiles_of_columns(s, width)
        low[c] = _tiles_of_columns(m + centre * s, width)
    if w.kind in cpu_gemv.HALF_KINDS:
        half_scale, half_low = _as_half_bits(scale), _as_half_bits(low)
        if half_scale is not None and half_low is not None:
            scale, low = half_scale, half_low
    return cpu_gemv.QuantizedCodesT(codes, scale, low, g, w.bits, n)


def _tiles_of_columns(values: np.ndarray, width: int) -> np.ndarray:
    """Per-column group values [count, K/G] -> [Nc/16, K/G, 16], zero-padded: a tile's scales
    for its whole K in one run, read in step with its codes."""
    count, groups = values.shape
    out = np.zeros((groups, width), np.float32)
    out[:, :count] = values.T
    return out.reshape(groups, width // 16, 16).transpose(1, 0, 2)


def _tiles4(t: np.ndarray) -> np.ndarray:
    """4-bit codes W.T [K, Nc] (one per byte) -> [Nc/16, K/32, 256] (kernels/cpu_simd.py):
    element 32b + 4j + 2h + e of column 16t + n in nibble h of byte 32j + 2n + e."""
    k, width = t.shape
    w = t.reshape(k // 32, 8, 2, 2, width // 16, 16)  # b, j, h, e, t, n
    packed: np.ndarray = w[:, :, 0] | (w[:, :, 1] << 4)  # b, j, e, t, n
    return packed.transpose(3, 0, 1, 4, 2).reshape(width // 16, k // 32, 256)


def _tiles8(t: np.ndarray, a: int) -> np.ndarray:
    """8-bit codes W.T [K, Nc] -> [Nc/16, K/a, 16 a] (kernels/cpu_simd.py): element
    a b + 4j + e of column 16t + 8h + n at byte 32 (2j + h) + 4n + e."""
    k, width = t.shape
    w = t.reshape(k // a, a // 4, 4, width // 16, 2, 8)  # b, j, e, t, h, n
    return w.transpose(3, 0, 1, 4, 5, 2).reshape(width // 16, k // a, 16 * a)


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
