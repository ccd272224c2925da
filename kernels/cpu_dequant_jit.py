"""numba's layout dequantized to bfloat16 W, for the bfloat16 GEMM that long prefill chunks take
on a CPU with AMX (engine/quant/cpu_layout.gemv_matmul via kernels/cpu_gemv.dequantize_bf16).
Imported only through `cpu_gemv.load()`, as kernels/cpu_gemv_jit.py is (whose doc says what
the annotations are for)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit, prange

from kvscope.kernels.cpu_gemv_jit import TILE, Bf16Array, Codes4, Codes8, as_f32, opts
from kvscope.kernels.cpu_simd import Float32Array, MetaArray


@njit(**opts)
def _bf16_column(
    values: Float32Array, bits: npt.NDArray[np.uint32], tile: Bf16Array, kk: int
) -> None:
    """tile[:, kk] = float32 values (their uint32 view `bits`) as bfloat16 bits, rounded to
    nearest even."""
    for n in range(TILE):
        v = bits[n]
        tile[n, kk] = np.uint16((v + np.uint32(0x7FFF) + ((v >> 16) & np.uint32(1))) >> 16)


@njit(**opts)
def _store_rows(tile: Bf16Array, out: Bf16Array, col0: int, k0: int) -> None:
    """A [16, A] block of W into out[col0 :, k0 :], a whole row of it at a time: written one
    element per row, W's rows K * 2 bytes apart (4 KB for K = 2048) fell in one cache set."""
    for n in range(TILE):
        for i in range(tile.shape[1]):
            out[col0 + n, k0 + i] = tile[n, i]


@njit(**opts)
def dequantize4_bf16(
    codes: Codes4, scale: MetaArray, low: MetaArray, group: int, out: Bf16Array
) -> None:
    """dequantize4 as bfloat16 bits (uint16), W itself: out [Nc, K], a tile's group at a time."""
    tiles, groups = codes.shape[0], codes.shape[1]
    lo_values, hi_values = np.empty(TILE, np.float32), np.empty(TILE, np.float32)
    lo_bits, hi_bits = lo_values.view(np.uint32), hi_values.view(np.uint32)
    s16, l16 = np.empty(TILE, np.float32), np.empty(TILE, np.float32)
    tile = np.empty((TILE, 32), np.uint16)
    for t in range(tiles):
        for b in range(groups):
            srow = scale[t, b * 32 // group]
            lrow = low[t, b * 32 // group]
            for n in range(TILE):
                s16[n], l16[n] = as_f32(srow[n]), as_f32(lrow[n])
            v = codes[t, b]
            for j in range(8):
                for e in range(2):  # low nibble: k = 4j + e; high: 4j + 2 + e
                    for n in range(TILE):
                        q = np.int32(v[32 * j + 2 * n + e])
                        lo_values[n] = s16[n] * np.float32(q & 15) + l16[n]
                        hi_values[n] = s16[n] * np.float32(q >> 4) + l16[n]
                    _bf16_column(lo_values, lo_bits, tile, 4 * j + e)
                    _bf16_column(hi_values, hi_bits, tile, 4 * j + e + 2)
            _store_rows(tile, out, t * TILE, b * 32)


@njit(**opts)
def dequantize8_bf16(
    codes: Codes8, scale: MetaArray, low: MetaArray, group: int, out: Bf16Array
) -> None:
    """dequantize8 as bfloat16 bits (uint16), W itself: out [Nc, K]."""
    tiles, groups = codes.shape[0], codes.shape[1]
    a = out.shape[1] // groups
    values = np.empty(TILE, np.float32)
    bits = values.view(np.uint32)
    tile = np.empty((TILE, a), np.uint16)
    for t in range(tiles):
        for b in range(groups):
            v = codes[t, b]
            for j in range(a // 4):
                for e in range(4):
                    kk = b * a + 4 * j + e
                    srow, lrow = scale[t, kk // group], low[t, kk // group]
                    for n in range(TILE):
                        q = np.float32(np.int32(v[32 * (2 * j + n // 8) + 4 * (n % 8) + e]))
                        values[n] = as_f32(srow[n]) * q + as_f32(lrow[n])
                    _bf16_column(values, bits, tile, 4 * j + e)
            _store_rows(tile, out, t * TILE, b * a)


@njit(parallel=True, **opts)
def dequantize4_bf16_parallel(
    codes: Codes4, scale: MetaArray, low: MetaArray, group: int, out: Bf16Array
) -> None:
    """Every chunk's W into out [chunks * Nc, K] bfloat16 bits, chunks shared among threads."""
    width = codes.shape[1] * TILE
    for c in prange(codes.shape[0]):
        dequantize4_bf16(codes[c], scale[c], low[c], group, out[c * width : (c + 1) * width])


@njit(parallel=True, **opts)
def dequantize8_bf16_parallel(
    codes: Codes8, scale: MetaArray, low: MetaArray, group: int, out: Bf16Array
) -> None:
    width = codes.shape[1] * TILE
    for c in prange(codes.shape[0]):
        dequantize8_bf16(codes[c], scale[c], low[c], group, out[c * width : (c + 1) * width])
