"""Quantized weights in kernels/cpu_gemv.py's layout (K-major column chunks, codes in tiles),
built from the packed format chunk by chunk, with no second copy of the codes kept."""

from __future__ import annotations

import numpy as np
import torch

from kvscope.engine.quant.packed_readers import codes_of, group_scales_of
from kvscope.kernels import cpu_gemv
from kvscope.kernels.cpu_meta import (
    SUB_GROUPS,
    SUPER_KINDS,
    Offsets,
    SuperOffsets,
    SuperScales,
)
from kvscope.kernels.quant_format import QuantizedTensor


def gemv_layout(w: QuantizedTensor) -> cpu_gemv.QuantizedCodesT:
    """`w` transposed into column chunks; 8-bit codes centred (see kernels/cpu_gemv.py)."""
    n, k = w.shape
    g = w.group_size
    chunks, width = cpu_gemv.chunking(n)
    tiles = width // cpu_gemv.TILE
    super_blocks = _keeps_super_blocks(w)
    if not super_blocks:
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
        if not super_blocks:
            s, m = group_scales_of(w, rows)
            scale[c] = _tiles_of_columns(s, width)
            low[c] = _tiles_of_columns(m + centre * s, width)
    if super_blocks:
        scales, parts = _super_blocks(w, chunks, width, centre)
        return cpu_gemv.QuantizedCodesT(codes, scales, parts, g, w.bits, n)
    offsets = _offsets(scale, low)
    kept = [scale] + ([low] if offsets is low else [])
    if w.kind in cpu_gemv.HALF_KINDS and all(_is_half(values) for values in kept):
        scale = _half_bits(scale)
        offsets = _half_bits(low) if offsets is low else offsets
    return cpu_gemv.QuantizedCodesT(codes, scale, offsets, g, w.bits, n)


def _keeps_super_blocks(w: QuantizedTensor) -> bool:
    """Whether `w`'s layout keeps its file's super-blocks (kernels/cpu_gemv.py's module doc):
    float16 d and dmin, byte-sized sub-scales and sub-mins of SUB_GROUPS groups each."""
    return (
        w.kind in SUPER_KINDS
        and w.super_group_size == SUB_GROUPS * w.group_size
        and w.d.dtype == w.dmin.dtype == torch.float16
        and w.sub_scale is not None
        and w.sub_min is not None
        and all(int(part.min()) >= 0 for part in (w.sub_scale, w.sub_min))
    )


def _super_blocks(
    w: QuantizedTensor, chunks: int, width: int, centre: int
) -> tuple[SuperScales, SuperOffsets]:
    """(sc, d) and (m, dmin, c) of kernels/cpu_gemv.py's layout, each [C, Nc/16, groups, 16]."""
    assert w.sub_scale is not None and w.sub_min is not None  # _keeps_super_blocks
    parts = []
    for per_column in (
        w.sub_scale.numpy().astype(np.uint8),  # 6-bit: >= 0 (_keeps_super_blocks)
        w.d.view(torch.int16).numpy().view(np.uint16),
        w.sub_min.numpy().astype(np.uint8),
        w.dmin.view(torch.int16).numpy().view(np.uint16),
    ):
        out = np.zeros((chunks, width // 16, per_column.shape[1], 16), per_column.dtype)
        for c in range(chunks):
            columns = per_column[c * width : (c + 1) * width]
            out[c] = _tiles_of_columns(columns, width, per_column.dtype)
        parts.append(out)
    return (parts[0], parts[1]), (parts[2], parts[3], np.float32(centre))


def _tiles_of_columns(
    values: np.ndarray, width: int, dtype: np.dtype | type = np.float32
) -> np.ndarray:
    """Per-column group values [count, K/G] -> [Nc/16, K/G, 16], zero-padded: a tile's scales
    for its whole K in one run, read in step with its codes."""
    count, groups = values.shape
    out = np.zeros((groups, width), dtype)
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
    """c where every group's offset is -c times its scale (Q5_0: 16, Q8_0: 128, Q6_K: 32,
    whose sub-scales scale both): centring the codes on it makes low exactly 0, kept as no
    array at all (centring on the codes in use would not)."""
    if w.sub_min is not w.sub_scale:  # offsets scaled apart from the scales (Q4_K's m)
        return None
    d, offset = w.d.float().numpy(), -w.dmin.float().numpy()
    scaled = d != 0  # an all-zero group says nothing about c
    if not scaled.any():
        return None
    centre = int(round(float(offset[scaled][0] / d[scaled][0])))
    if centre <= 0 or not np.array_equal(offset, centre * d):
        return None
    return centre


def _offsets(scale: np.ndarray, low: np.ndarray) -> Offsets:
    """low as the kernels take it (kernels/cpu_gemv.py): None where every offset is 0, a
    float32 m where every one is exactly m * scale in float32 (a symmetric format: Q4_0's -8),
    so that the kernels' m * scale is the value an array would have held, else low itself."""
    if not low.any():
        return None
    scaled = np.flatnonzero(scale)
    if scaled.size:
        m = np.float32(low.flat[scaled[0]] / scale.flat[scaled[0]])
        with np.errstate(over="ignore"):  # an overflow is an inexact m: the array stays
            if np.array_equal(m * scale, low):
                return m
    return low


def _is_half(values: np.ndarray) -> bool:
    """Every float32 value is exactly a float16."""
    with np.errstate(over="ignore"):  # one past float16's range is no float16: inf != it
        return np.array_equal(values.astype(np.float16).astype(np.float32), values)


def _half_bits(values: np.ndarray) -> np.ndarray:
    """float32 values, each exactly a float16 (`_is_half`), as float16 bits (uint16)."""
    return values.astype(np.float16).view(np.uint16)
