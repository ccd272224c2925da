"""numba's layout dequantized to bfloat16 W, for the bfloat16 GEMM that long prefill chunks take
on a CPU with AMX (engine/quant/cpu_layout.gemv_matmul via kernels/cpu_gemv.dequantize_bf16).
Imported only through `cpu_gemv.load()`, as kernels/cpu_gemv_jit.py is (whose doc says what
the annotations are for)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from kvscope.kernels.cpu_gemv_jit import TILE, Bf16Array, Codes4, Codes8, opts
from kvscope.kernels.cpu_meta import Offsets, Scales
from kvscope.kernels.cpu_meta_jit import low_at, meta_part, scale_at


@njit(inline="always", **opts)
def _bf16_bits(v: np.uint32) -> np.uint16:
    """float32 bits as bfloat16 bits, rounded to nearest even."""
    return np.uint16((v + np.uint32(0x7FFF) + ((v >> 16) & np.uint32(1))) >> 16)


@njit(**opts)
def dequantize4_bf16(
    codes: Codes4, scale: Scales, low: Offsets, group: int, out: Bf16Array
) -> None:
    """dequantize4 as bfloat16 bits (uint16), W itself: out [Nc, K], one column's 32 weights of
    a tile's group at a time, written to its row of W in order. A column's group has one scale
    and offset, so its 16 possible values are computed once (the same float32 ops) and each
    nibble looks its value up: 1.4x faster than computing all 32. A [16, 32] tile transposed
    through a scratch block, one call per 16 values, took 3x as long; this runs once per matrix
    per long prefill chunk."""
    tiles, groups = codes.shape[0], codes.shape[1]
    values = np.empty(16, np.float32)
    bits = values.view(np.uint32)
    table = np.empty(16, np.uint16)
    for t in range(tiles):
        for b in range(groups):
            g = b * 32 // group
            v = codes[t, b]
            for n in range(TILE):
                s = scale_at(scale, t, g, n)
                lo = low_at(low, t, g, n, s)
                for q in range(16):
                    values[q] = s * np.float32(q) + lo
                for q in range(16):
                    table[q] = _bf16_bits(bits[q])
                row = out[t * TILE + n]
                for j in range(8):
                    for e in range(2):  # low nibble: k = 4j + e; high: 4j + 2 + e
                        code = v[32 * j + 2 * n + e]
                        row[b * 32 + 4 * j + e] = table[code & 15]
                        row[b * 32 + 4 * j + 2 + e] = table[code >> 4]


@njit(**opts)
def dequantize8_bf16(
    codes: Codes8, scale: Scales, low: Offsets, group: int, out: Bf16Array
) -> None:
    """dequantize8 as bfloat16 bits (uint16), W itself: out [Nc, K], a column's A weights of a
    tile's group at a time (as dequantize4_bf16)."""
    tiles, groups = codes.shape[0], codes.shape[1]
    a = out.shape[1] // groups
    values = np.empty(a, np.float32)
    bits = values.view(np.uint32)
    for t in range(tiles):
        for b in range(groups):
            v = codes[t, b]
            for n in range(TILE):
                base = 4 * (n % 8)
                for j in range(a // 4):
                    at = 32 * (2 * j + n // 8) + base
                    g = (b * a + 4 * j) // group  # a group holds 4 k at least (Q6_K: 16)
                    s = scale_at(scale, t, g, n)
                    lo = low_at(low, t, g, n, s)
                    for e in range(4):
                        values[4 * j + e] = s * np.float32(np.int32(v[at + e])) + lo
                row = out[t * TILE + n]
                for i in range(a):
                    row[b * a + i] = _bf16_bits(bits[i])


@njit(parallel=True, **opts)
def dequantize4_bf16_parallel(
    codes: Codes4, scale: Scales, low: Offsets, group: int, out: Bf16Array
) -> None:
    """Every chunk's W into out [chunks * Nc, K] bfloat16 bits, chunks shared among threads."""
    width = codes.shape[1] * TILE
    for c in prange(codes.shape[0]):
        dequantize4_bf16(
            codes[c],
            meta_part(scale, c),
            meta_part(low, c),
            group,
            out[c * width : (c + 1) * width],
        )


@njit(parallel=True, **opts)
def dequantize8_bf16_parallel(
    codes: Codes8, scale: Scales, low: Offsets, group: int, out: Bf16Array
) -> None:
    width = codes.shape[1] * TILE
    for c in prange(codes.shape[0]):
        dequantize8_bf16(
            codes[c],
            meta_part(scale, c),
            meta_part(low, c),
            group,
            out[c * width : (c + 1) * width],
        )
