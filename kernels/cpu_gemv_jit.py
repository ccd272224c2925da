"""The numba-compiled half of kernels/cpu_gemv.py (see there): imported only through
`cpu_gemv.load()`, so that numba stays optional. Module-level functions, because numba's disk
cache cannot key functions defined inside another function (they recompiled every run).

numba compiles for the arrays a call passes: the annotations are for the reader (and mypy)."""

from __future__ import annotations

from typing import Literal, TypeAlias, TypedDict

import numpy as np
import numpy.typing as npt
from numba import njit, prange

from kvscope.kernels.cpu_meta import Offsets, Scales
from kvscope.kernels.cpu_meta_jit import low_at, meta_flat, meta_part, scale_at
from kvscope.kernels.cpu_simd import (
    ROW_BLOCK,
    Float32Array,
    Int8Array,
    prefetch,
    tile4_block,
    tile4_row,
    tile8_block_16,
    tile8_block_32,
    tile8_row_16,
    tile8_row_32,
)

Codes4: TypeAlias = npt.NDArray[np.uint8]  # 4-bit codes, two per byte
Codes8: TypeAlias = npt.NDArray[np.int8]  # 8-bit codes, centred
Bf16Array: TypeAlias = npt.NDArray[np.uint16]  # bfloat16 values as their bits

INT8_MAX = 127
TILE = 16  # columns per tile of 4-bit codes (see kernels/cpu_gemv.py's layout)
AHEAD = 2048  # bytes of codes prefetched ahead of the tile being multiplied
PASS_BYTES = 128 << 10  # int8 activations one pass over a matrix's tiles multiplies (in L2)
# Up to this many rows (every decode step: the fused decode takes 64 at most) go in one pass, so
# a step reads each matrix's codes from memory once, as it did before the passes.
ONE_PASS_ROWS = 64


class JitOptions(TypedDict):
    """The options every kernel here is compiled with (numba's `njit` keywords)."""

    fastmath: bool
    cache: bool
    boundscheck: bool
    error_model: Literal["python", "numpy"]
    nogil: bool


opts: JitOptions = dict(
    fastmath=True, cache=True, boundscheck=False, error_model="numpy", nogil=True
)


@njit(inline="always", **opts)
def rows_per_pass(k: int, m_rows: int) -> int:
    """Rows of activations a pass over the tiles takes: all of a decode step's, else a multiple
    of ROW_BLOCK whose K bytes each stay in L2 while every tile's codes go by (a tile re-read
    all of a prefill chunk's before)."""
    if m_rows <= ONE_PASS_ROWS:
        return ONE_PASS_ROWS
    return max(ROW_BLOCK, PASS_BYTES // k // ROW_BLOCK * ROW_BLOCK)


@njit(**opts)
def quantize_rows(
    x: Float32Array, group: int, xq: Int8Array, xd: Float32Array, xs: Float32Array
) -> None:
    """x float32 [M, K] -> int8 xq [M, K], per-group scale xd and sum xs [M, K/group].

    xs is the sum of the rounded values (d * sum(xq)), as llama.cpp's q8_1 keeps it, not of x:
    a weight's offset then multiplies the same activations its codes do, so for symmetric
    formats (Q4_0's w = d (q - 8)) the two terms cancel as they should (the float sum of x
    measured 2x the error on Q4_0)."""
    m_rows, k = x.shape
    for m in range(m_rows):
        for b in range(k // group):
            amax = np.float32(0.0)
            for j in range(b * group, (b + 1) * group):
                amax = max(amax, abs(x[m, j]))
            d = amax / np.float32(INT8_MAX)
            inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
            total = np.int32(0)
            for j in range(b * group, (b + 1) * group):
                q = np.int32(np.rint(x[m, j] * inv))
                xq[m, j] = np.int8(q)
                total += q
            xd[m, b] = d
            xs[m, b] = d * np.float32(total)


@njit(**opts)
def chunk4(
    codes: Codes4,
    scale: Scales,
    low: Offsets,
    xq: Int8Array,
    xd: Float32Array,
    xs: Float32Array,
    group: int,
    y: Float32Array,
) -> None:
    """One chunk, 4-bit codes uint8 [Nc/16, K/32, 256] (tile, group: kernels/cpu_simd.py's
    layout); y [M, Nc] float32 is overwritten. A tile's whole K is contiguous and the tiles
    follow each other, so the chunk is one stream, which the loop also prefetches AHEAD bytes
    ahead (codes, scales, offsets): the hardware prefetcher alone kept too few lines in flight
    (PERFORMANCE.md, "Prefetch in the GEMV"). Rows go 4
    at a time through one call (the codes are split into nibbles once for the 4), the rest one
    by one."""
    tiles, groups = codes.shape[0], codes.shape[1]
    m_rows, k = xq.shape
    nc = y.shape[1]
    per_weight_group = group // 32
    weight_groups = groups // per_weight_group
    flat, xflat, yflat = codes.reshape(-1), xq.reshape(-1), y.reshape(-1)
    dflat, sflat = xd.reshape(-1), xs.reshape(-1)
    sc, lw = meta_flat(scale), meta_flat(low)
    for i in range(yflat.shape[0]):
        yflat[i] = 0.0
    rows = rows_per_pass(k, m_rows)
    for r0 in range(0, m_rows, rows):
        r1 = min(m_rows, r0 + rows)
        for t in range(tiles):
            for b in range(groups):
                at = (t * groups + b) * 256
                w_at = (t * weight_groups + b // per_weight_group) * TILE
                for e in range(0, 256, 64):
                    prefetch(flat, at + AHEAD + e)
                prefetch(sc, w_at + AHEAD // 8)
                prefetch(lw, w_at + AHEAD // 8)
                m = r0
                while m + ROW_BLOCK <= r1:
                    tile4_block(
                        flat,
                        at,
                        xflat,
                        m * k + b * 32,
                        k,
                        dflat,
                        sflat,
                        m * groups + b,
                        groups,
                        sc,
                        lw,
                        w_at,
                        yflat,
                        m * nc + t * TILE,
                        nc,
                    )
                    m += ROW_BLOCK
                while m < r1:
                    tile4_row(
                        flat,
                        at,
                        xflat,
                        m * k + b * 32,
                        k,
                        dflat,
                        sflat,
                        m * groups + b,
                        groups,
                        sc,
                        lw,
                        w_at,
                        yflat,
                        m * nc + t * TILE,
                        nc,
                    )
                    m += 1


@njit(**opts)
def chunk8(
    codes: Codes8,
    scale: Scales,
    low: Offsets,
    xq: Int8Array,
    xd: Float32Array,
    xs: Float32Array,
    group: int,
    y: Float32Array,
) -> None:
    """One chunk, centred 8-bit codes int8 [Nc/16, K/A, 16 A] (tile, activation group of A =
    16 or 32: kernels/cpu_simd.py's layout), read in order as chunk4 does."""
    tiles, groups = codes.shape[0], codes.shape[1]
    m_rows, k = xq.shape
    a = k // groups
    nc = y.shape[1]
    per_weight_group = group // a
    weight_groups = groups // per_weight_group
    flat, xflat, yflat = codes.reshape(-1), xq.reshape(-1), y.reshape(-1)
    dflat, sflat = xd.reshape(-1), xs.reshape(-1)
    sc, lw = meta_flat(scale), meta_flat(low)
    for i in range(yflat.shape[0]):
        yflat[i] = 0.0
    rows = rows_per_pass(k, m_rows)
    for r0 in range(0, m_rows, rows):
        r1 = min(m_rows, r0 + rows)
        for t in range(tiles):
            for b in range(groups):
                at = (t * groups + b) * TILE * a
                w_at = (t * weight_groups + b // per_weight_group) * TILE
                for e in range(0, TILE * a, 64):
                    prefetch(flat, at + AHEAD + e)
                prefetch(sc, w_at + AHEAD // 8)
                prefetch(lw, w_at + AHEAD // 8)
                m = r0
                while m + ROW_BLOCK <= r1:
                    x_at, d_at, y_at = m * k + b * a, m * groups + b, m * nc + t * TILE
                    if a == 32:
                        tile8_block_32(
                            flat,
                            at,
                            xflat,
                            x_at,
                            k,
                            dflat,
                            sflat,
                            d_at,
                            groups,
                            sc,
                            lw,
                            w_at,
                            yflat,
                            y_at,
                            nc,
                        )
                    else:
                        tile8_block_16(
                            flat,
                            at,
                            xflat,
                            x_at,
                            k,
                            dflat,
                            sflat,
                            d_at,
                            groups,
                            sc,
                            lw,
                            w_at,
                            yflat,
                            y_at,
                            nc,
                        )
                    m += ROW_BLOCK
                while m < r1:
                    x_at, d_at, y_at = m * k + b * a, m * groups + b, m * nc + t * TILE
                    if a == 32:
                        tile8_row_32(
                            flat,
                            at,
                            xflat,
                            x_at,
                            k,
                            dflat,
                            sflat,
                            d_at,
                            groups,
                            sc,
                            lw,
                            w_at,
                            yflat,
                            y_at,
                            nc,
                        )
                    else:
                        tile8_row_16(
                            flat,
                            at,
                            xflat,
                            x_at,
                            k,
                            dflat,
                            sflat,
                            d_at,
                            groups,
                            sc,
                            lw,
                            w_at,
                            yflat,
                            y_at,
                            nc,
                        )
                    m += 1


@njit(**opts)
def bf16_to_f32(bits: Bf16Array) -> Float32Array:
    out = np.empty(bits.shape, np.float32)
    u = out.view(np.uint32)
    for m in range(bits.shape[0]):
        for j in range(bits.shape[1]):
            u[m, j] = np.uint32(bits[m, j]) << np.uint32(16)
    return out


@njit(**opts)
def columns_bf16(y: Float32Array, n: int) -> Bf16Array:
    """[chunks, M, Nc] float32 -> [M, n] bfloat16 bits, rounded to nearest even."""
    chunks, m_rows, width = y.shape
    out = np.empty((m_rows, n), np.uint16)
    u = y.view(np.uint32)
    for c in range(chunks):
        stop = min(width, n - c * width)
        for m in range(m_rows):
            row = u[c, m]
            dest = out[m]
            for j in range(stop):
                v = row[j]
                v += np.uint32(0x7FFF) + ((v >> np.uint32(16)) & np.uint32(1))
                dest[c * width + j] = np.uint16(v >> np.uint32(16))
    return out


@njit(**opts)
def rounded(x: Float32Array, act_group: int) -> tuple[Int8Array, Float32Array, Float32Array]:
    m, k = x.shape
    xq = np.empty((m, k), np.int8)
    xd = np.empty((m, k // act_group), np.float32)
    xs = np.empty_like(xd)
    quantize_rows(x, act_group, xq, xd, xs)
    return xq, xd, xs


@njit(**opts)
def rounded4(
    codes: Codes4,
    scale: Scales,
    low: Offsets,
    xq: Int8Array,
    xd: Float32Array,
    xs: Float32Array,
    group: int,
    y: Float32Array,
) -> None:
    """y float32 [chunks, M, Nc] from activations already rounded (xq, xd, xs), one thread;
    shared with the fused decode (kernels/cpu_decode_jit.py), which rounds them itself."""
    for c in range(codes.shape[0]):
        chunk4(codes[c], meta_part(scale, c), meta_part(low, c), xq, xd, xs, group, y[c])


@njit(**opts)
def rounded8(
    codes: Codes8,
    scale: Scales,
    low: Offsets,
    xq: Int8Array,
    xd: Float32Array,
    xs: Float32Array,
    group: int,
    y: Float32Array,
) -> None:
    for c in range(codes.shape[0]):
        chunk8(codes[c], meta_part(scale, c), meta_part(low, c), xq, xd, xs, group, y[c])


@njit(parallel=True, **opts)
def rounded4_parallel(
    codes: Codes4,
    scale: Scales,
    low: Offsets,
    xq: Int8Array,
    xd: Float32Array,
    xs: Float32Array,
    group: int,
    y: Float32Array,
) -> None:
    """rounded4 with the chunks shared among numba's threads."""
    for c in prange(codes.shape[0]):
        chunk4(codes[c], meta_part(scale, c), meta_part(low, c), xq, xd, xs, group, y[c])


@njit(parallel=True, **opts)
def rounded8_parallel(
    codes: Codes8,
    scale: Scales,
    low: Offsets,
    xq: Int8Array,
    xd: Float32Array,
    xs: Float32Array,
    group: int,
    y: Float32Array,
) -> None:
    for c in prange(codes.shape[0]):
        chunk8(codes[c], meta_part(scale, c), meta_part(low, c), xq, xd, xs, group, y[c])


@njit(**opts)
def _output(codes: Codes4 | Codes8, x: Float32Array) -> Float32Array:
    return np.empty((codes.shape[0], x.shape[0], codes.shape[1] * TILE), np.float32)


@njit(**opts)
def serial4(
    codes: Codes4,
    scale: Scales,
    low: Offsets,
    x: Float32Array,
    act_group: int,
    group: int,
) -> Float32Array:
    xq, xd, xs = rounded(x, act_group)
    y = _output(codes, x)
    rounded4(codes, scale, low, xq, xd, xs, group, y)
    return y


@njit(**opts)
def serial8(
    codes: Codes8,
    scale: Scales,
    low: Offsets,
    x: Float32Array,
    act_group: int,
    group: int,
) -> Float32Array:
    xq, xd, xs = rounded(x, act_group)
    y = _output(codes, x)
    rounded8(codes, scale, low, xq, xd, xs, group, y)
    return y


@njit(**opts)
def parallel4(
    codes: Codes4,
    scale: Scales,
    low: Offsets,
    x: Float32Array,
    act_group: int,
    group: int,
) -> Float32Array:
    xq, xd, xs = rounded(x, act_group)
    y = _output(codes, x)
    rounded4_parallel(codes, scale, low, xq, xd, xs, group, y)
    return y


@njit(**opts)
def parallel8(
    codes: Codes8,
    scale: Scales,
    low: Offsets,
    x: Float32Array,
    act_group: int,
    group: int,
) -> Float32Array:
    xq, xd, xs = rounded(x, act_group)
    y = _output(codes, x)
    rounded8_parallel(codes, scale, low, xq, xd, xs, group, y)
    return y


@njit(**opts)
def serial4_bf16(
    codes: Codes4,
    scale: Scales,
    low: Offsets,
    bits: Bf16Array,
    act_group: int,
    group: int,
    n: int,
) -> Bf16Array:
    return columns_bf16(serial4(codes, scale, low, bf16_to_f32(bits), act_group, group), n)


@njit(**opts)
def serial8_bf16(
    codes: Codes8,
    scale: Scales,
    low: Offsets,
    bits: Bf16Array,
    act_group: int,
    group: int,
    n: int,
) -> Bf16Array:
    return columns_bf16(serial8(codes, scale, low, bf16_to_f32(bits), act_group, group), n)


@njit(**opts)
def parallel4_bf16(
    codes: Codes4,
    scale: Scales,
    low: Offsets,
    bits: Bf16Array,
    act_group: int,
    group: int,
    n: int,
) -> Bf16Array:
    y = parallel4(codes, scale, low, bf16_to_f32(bits), act_group, group)
    return columns_bf16(y, n)


@njit(**opts)
def parallel8_bf16(
    codes: Codes8,
    scale: Scales,
    low: Offsets,
    bits: Bf16Array,
    act_group: int,
    group: int,
    n: int,
) -> Bf16Array:
    y = parallel8(codes, scale, low, bf16_to_f32(bits), act_group, group)
    return columns_bf16(y, n)


@njit(**opts)
def dequantize4(codes: Codes4, scale: Scales, low: Offsets, group: int, out: Float32Array) -> None:
    """One chunk of 4-bit codes [Nc/16, K/32, 256] -> float32 W.T [K, Nc]."""
    tiles, groups = codes.shape[0], codes.shape[1]
    for t in range(tiles):
        for b in range(groups):
            g = b * 32 // group
            v = codes[t, b]
            for j in range(8):
                for n in range(TILE):
                    col = t * TILE + n
                    s = scale_at(scale, t, g, n)
                    lo = low_at(low, t, g, n, s)
                    for e in range(2):
                        # int32 before float: numba widens integer ops to int64, which AVX2
                        # cannot convert to float in vectors (measured 5x slower).
                        q = np.int32(v[32 * j + 2 * n + e])
                        kk = b * 32 + 4 * j + e
                        out[kk, col] = s * np.float32(q & 15) + lo
                        out[kk + 2, col] = s * np.float32(q >> 4) + lo


@njit(**opts)
def dequantize8(codes: Codes8, scale: Scales, low: Offsets, group: int, out: Float32Array) -> None:
    """One chunk of 8-bit codes [Nc/16, K/A, 16 A] -> float32 W.T [K, Nc]."""
    tiles, groups = codes.shape[0], codes.shape[1]
    a = out.shape[0] // groups
    for t in range(tiles):
        for b in range(groups):
            v = codes[t, b]
            for j in range(a // 4):
                for h in range(2):
                    for n in range(8):
                        col = 8 * h + n
                        for e in range(4):
                            kk = b * a + 4 * j + e
                            q = np.float32(np.int32(v[32 * (2 * j + h) + 4 * n + e]))
                            s = scale_at(scale, t, kk // group, col)
                            lo = low_at(low, t, kk // group, col, s)
                            out[kk, t * TILE + col] = s * q + lo
