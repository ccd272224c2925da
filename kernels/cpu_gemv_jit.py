"""The numba-compiled half of kernels/cpu_gemv.py (see there): imported only through
`cpu_gemv.load()`, so that numba stays optional. Module-level functions, because numba's disk
cache cannot key functions defined inside another function (they recompiled every run)."""

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

INT8_MAX = 127
TILE = 16  # columns per tile of 4-bit codes (see kernels/cpu_gemv.py's layout)
opts = dict(fastmath=True, cache=True, boundscheck=False, error_model="numpy", nogil=True)


@intrinsic
def as_f32(typingctx, value):
    """A scale or offset as float32: uint16 holds float16 bits (widened exactly: LLVM's fpext,
    one vcvtph2ps per 8 values on x86 with F16C), float32 passes through."""
    if value == types.uint16:

        def widen(context, builder, signature, args):
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

        return types.float32(value), widen
    if value == types.float32:
        return types.float32(value), lambda context, builder, signature, args: args[0]
    return None


@njit(**opts)
def quantize_rows(x, group, xq, xd, xs):
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
def epilogue(srow, lrow, d, s, pm, ym):
    for n in range(ym.shape[0]):
        ym[n] += as_f32(srow[n]) * d * np.float32(pm[n]) + as_f32(lrow[n]) * s


@njit(**opts)
def chunk4(codes, scale, low, xq, xd, xs, group, run, y, part, p16):
    """One chunk, 4-bit codes uint8 [K/32, Nc/16, 16, 16] (group, tile, byte row, column);
    y [M, Nc] float32 is overwritten. Activation groups of 32 (every 4-bit format's group is a
    multiple). A tile's 16 byte rows are 256 contiguous bytes and the tiles of a group follow
    each other, so the codes are read strictly in order: one stream the hardware prefetcher
    follows, where 16 rows of Nc bytes read side by side were 16 short streams it did not
    (measured 16.5 -> 8.2 ms for the bundled model's 120 matrices streamed from DRAM, with
    float16 scales). Per tile, two int16 sums of 16 products each (at most 16 * 15 * 127 =
    30480), stored in `p16` and `part` (as int16) and scaled by one loop over the columns per
    group: the tile loop then holds int16 only and LLVM vectorises it 16 lanes wide (8 with
    the float epilogue inside it, measured 1.1-1.2x slower at M = 4). `run` is unused."""
    groups, tiles = codes.shape[0], codes.shape[1]
    nc = tiles * TILE
    m_rows = xq.shape[0]
    per_weight_group = group // 32
    high = part.view(np.int16)  # int32 [Nc] scratch as int16: the high halves' sums
    for m in range(m_rows):
        ym = y[m]
        for n in range(nc):
            ym[n] = 0.0
    for b in range(groups):
        srow = scale[b // per_weight_group]
        lrow = low[b // per_weight_group]
        for m in range(m_rows):
            x = xq[m, b * 32 : b * 32 + 32]
            x0, x1, x2, x3 = np.int16(x[0]), np.int16(x[1]), np.int16(x[2]), np.int16(x[3])
            x4, x5, x6, x7 = np.int16(x[4]), np.int16(x[5]), np.int16(x[6]), np.int16(x[7])
            x8, x9, x10, x11 = np.int16(x[8]), np.int16(x[9]), np.int16(x[10]), np.int16(x[11])
            x12, x13, x14, x15 = np.int16(x[12]), np.int16(x[13]), np.int16(x[14]), np.int16(x[15])
            x16, x17, x18, x19 = np.int16(x[16]), np.int16(x[17]), np.int16(x[18]), np.int16(x[19])
            x20, x21, x22, x23 = np.int16(x[20]), np.int16(x[21]), np.int16(x[22]), np.int16(x[23])
            x24, x25, x26, x27 = np.int16(x[24]), np.int16(x[25]), np.int16(x[26]), np.int16(x[27])
            x28, x29, x30, x31 = np.int16(x[28]), np.int16(x[29]), np.int16(x[30]), np.int16(x[31])
            d = xd[m, b]
            s = xs[m, b]
            ym = y[m]
            for t in range(tiles):
                tc = codes[b, t]
                c0, c1, c2, c3 = tc[0], tc[1], tc[2], tc[3]
                c4, c5, c6, c7 = tc[4], tc[5], tc[6], tc[7]
                c8, c9, c10, c11 = tc[8], tc[9], tc[10], tc[11]
                c12, c13, c14, c15 = tc[12], tc[13], tc[14], tc[15]
                o = t * TILE
                for n in range(TILE):
                    q0, q1, q2, q3 = (
                        np.int16(c0[n]),
                        np.int16(c1[n]),
                        np.int16(c2[n]),
                        np.int16(c3[n]),
                    )
                    q4, q5, q6, q7 = (
                        np.int16(c4[n]),
                        np.int16(c5[n]),
                        np.int16(c6[n]),
                        np.int16(c7[n]),
                    )
                    lo = np.int16(
                        (q0 & 15) * x0 + (q0 >> 4) * x1 + (q1 & 15) * x2 + (q1 >> 4) * x3
                        + (q2 & 15) * x4 + (q2 >> 4) * x5 + (q3 & 15) * x6 + (q3 >> 4) * x7
                        + (q4 & 15) * x8 + (q4 >> 4) * x9 + (q5 & 15) * x10 + (q5 >> 4) * x11
                        + (q6 & 15) * x12 + (q6 >> 4) * x13 + (q7 & 15) * x14 + (q7 >> 4) * x15
                    )  # fmt: skip
                    q0, q1, q2, q3 = (
                        np.int16(c8[n]),
                        np.int16(c9[n]),
                        np.int16(c10[n]),
                        np.int16(c11[n]),
                    )
                    q4, q5, q6, q7 = (
                        np.int16(c12[n]), np.int16(c13[n]), np.int16(c14[n]), np.int16(c15[n])
                    )  # fmt: skip
                    hi = np.int16(
                        (q0 & 15) * x16 + (q0 >> 4) * x17 + (q1 & 15) * x18 + (q1 >> 4) * x19
                        + (q2 & 15) * x20 + (q2 >> 4) * x21 + (q3 & 15) * x22 + (q3 >> 4) * x23
                        + (q4 & 15) * x24 + (q4 >> 4) * x25 + (q5 & 15) * x26 + (q5 >> 4) * x27
                        + (q6 & 15) * x28 + (q6 >> 4) * x29 + (q7 & 15) * x30 + (q7 >> 4) * x31
                    )  # fmt: skip
                    p16[o + n] = lo
                    high[o + n] = hi
            for n in range(nc):
                total = np.float32(np.int32(p16[n]) + np.int32(high[n]))
                ym[n] += as_f32(srow[n]) * d * total + as_f32(lrow[n]) * s


@njit(**opts)
def chunk8(codes, scale, low, xq, xd, xs, group, run, y, part, p16):
    """One chunk, centred 8-bit codes int8 [K/8, Nc/T, 8, T] (8 rows, tile of T columns, row,
    column): 8 rows per pass over the columns, read in order tile by tile (the 4-bit kernel's
    reason; T = Nc where rows are long enough for the prefetcher, see cpu_gemv.tile_width),
    each pair of products summed in int16 (every 8-bit layout has run >= 2:
    |code| <= 128) and widened in registers, so only one int32 scratch row is stored per 8
    rows (measured 1.4-1.5x faster on the bundled Q8_0 head than storing an int16 scratch per
    pair; `p16` unused)."""
    # The tile width from the shape: T = 16 also compiled 1.4x faster as a runtime trip count.
    tiles, width = codes.shape[1], codes.shape[3]
    nc = tiles * width
    m_rows, k = xq.shape
    a = xq.shape[1] // xd.shape[1]
    per_weight_group = group // a
    for m in range(m_rows):
        ym = y[m]
        for n in range(nc):
            ym[n] = 0.0
    for b in range(k // a):
        srow = scale[b // per_weight_group]
        lrow = low[b // per_weight_group]
        for m in range(m_rows):
            xm = xq[m]
            for r in range(b * a, (b + 1) * a, 8):
                x0, x1 = np.int16(xm[r]), np.int16(xm[r + 1])
                x2, x3 = np.int16(xm[r + 2]), np.int16(xm[r + 3])
                x4, x5 = np.int16(xm[r + 4]), np.int16(xm[r + 5])
                x6, x7 = np.int16(xm[r + 6]), np.int16(xm[r + 7])
                first = r == b * a
                for t in range(tiles):
                    tc = codes[r // 8, t]
                    c0, c1, c2, c3 = tc[0], tc[1], tc[2], tc[3]
                    c4, c5, c6, c7 = tc[4], tc[5], tc[6], tc[7]
                    o = t * width
                    for n in range(width):
                        acc = (
                            np.int32(np.int16(np.int16(c0[n]) * x0 + np.int16(c1[n]) * x1))
                            + np.int32(np.int16(np.int16(c2[n]) * x2 + np.int16(c3[n]) * x3))
                            + np.int32(np.int16(np.int16(c4[n]) * x4 + np.int16(c5[n]) * x5))
                            + np.int32(np.int16(np.int16(c6[n]) * x6 + np.int16(c7[n]) * x7))
                        )
                        part[o + n] = acc if first else part[o + n] + acc
            epilogue(srow, lrow, xd[m, b], xs[m, b], part, y[m])


@njit(**opts)
def bf16_to_f32(bits):
    out = np.empty(bits.shape, np.float32)
    u = out.view(np.uint32)
    for m in range(bits.shape[0]):
        for j in range(bits.shape[1]):
            u[m, j] = np.uint32(bits[m, j]) << np.uint32(16)
    return out


@njit(**opts)
def columns_bf16(y, n):
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
def rounded(x, act_group):
    m, k = x.shape
    xq = np.empty((m, k), np.int8)
    xd = np.empty((m, k // act_group), np.float32)
    xs = np.empty_like(xd)
    quantize_rows(x, act_group, xq, xd, xs)
    return xq, xd, xs


@njit(**opts)
def rounded4(codes, scale, low, xq, xd, xs, group, run, y):
    """y float32 [chunks, M, Nc] from activations already rounded (xq, xd, xs), one thread;
    shared with the fused decode (kernels/cpu_decode_jit.py), which rounds them itself."""
    width = scale.shape[2]
    part = np.empty(width, np.int32)
    p16 = np.empty(width, np.int16)
    for c in range(scale.shape[0]):
        chunk4(codes[c], scale[c], low[c], xq, xd, xs, group, run, y[c], part, p16)


@njit(**opts)
def rounded8(codes, scale, low, xq, xd, xs, group, run, y):
    width = scale.shape[2]
    part = np.empty(width, np.int32)
    p16 = np.empty(width, np.int16)
    for c in range(scale.shape[0]):
        chunk8(codes[c], scale[c], low[c], xq, xd, xs, group, run, y[c], part, p16)


@njit(parallel=True, **opts)
def rounded4_parallel(codes, scale, low, xq, xd, xs, group, run, y):
    """rounded4 with the chunks shared among numba's threads."""
    chunks, width = scale.shape[0], scale.shape[2]
    part = np.empty((chunks, width), np.int32)
    p16 = np.empty((chunks, width), np.int16)
    for c in prange(chunks):
        chunk4(codes[c], scale[c], low[c], xq, xd, xs, group, run, y[c], part[c], p16[c])


@njit(parallel=True, **opts)
def rounded8_parallel(codes, scale, low, xq, xd, xs, group, run, y):
    chunks, width = scale.shape[0], scale.shape[2]
    part = np.empty((chunks, width), np.int32)
    p16 = np.empty((chunks, width), np.int16)
    for c in prange(chunks):
        chunk8(codes[c], scale[c], low[c], xq, xd, xs, group, run, y[c], part[c], p16[c])


@njit(**opts)
def _output(scale, x):
    return np.empty((scale.shape[0], x.shape[0], scale.shape[2]), np.float32)


@njit(**opts)
def serial4(codes, scale, low, x, act_group, group, run):
    xq, xd, xs = rounded(x, act_group)
    y = _output(scale, x)
    rounded4(codes, scale, low, xq, xd, xs, group, run, y)
    return y


@njit(**opts)
def serial8(codes, scale, low, x, act_group, group, run):
    xq, xd, xs = rounded(x, act_group)
    y = _output(scale, x)
    rounded8(codes, scale, low, xq, xd, xs, group, run, y)
    return y


@njit(**opts)
def parallel4(codes, scale, low, x, act_group, group, run):
    xq, xd, xs = rounded(x, act_group)
    y = _output(scale, x)
    rounded4_parallel(codes, scale, low, xq, xd, xs, group, run, y)
    return y


@njit(**opts)
def parallel8(codes, scale, low, x, act_group, group, run):
    xq, xd, xs = rounded(x, act_group)
    y = _output(scale, x)
    rounded8_parallel(codes, scale, low, xq, xd, xs, group, run, y)
    return y


@njit(**opts)
def serial4_bf16(codes, scale, low, bits, act_group, group, run, n):
    return columns_bf16(serial4(codes, scale, low, bf16_to_f32(bits), act_group, group, run), n)


@njit(**opts)
def serial8_bf16(codes, scale, low, bits, act_group, group, run, n):
    return columns_bf16(serial8(codes, scale, low, bf16_to_f32(bits), act_group, group, run), n)


@njit(**opts)
def parallel4_bf16(codes, scale, low, bits, act_group, group, run, n):
    y = parallel4(codes, scale, low, bf16_to_f32(bits), act_group, group, run)
    return columns_bf16(y, n)


@njit(**opts)
def parallel8_bf16(codes, scale, low, bits, act_group, group, run, n):
    y = parallel8(codes, scale, low, bf16_to_f32(bits), act_group, group, run)
    return columns_bf16(y, n)


@njit(**opts)
def dequantize4(codes, scale, low, group, out):
    """One chunk of 4-bit codes [K/32, Nc/16, 16, 16] -> float32 W.T [K, Nc]."""
    groups, tiles = codes.shape[0], codes.shape[1]
    for b in range(groups):
        srow = scale[b * 32 // group]
        lrow = low[b * 32 // group]
        for t in range(tiles):
            for r in range(16):
                row = codes[b, t, r]
                even = out[b * 32 + 2 * r]
                odd = out[b * 32 + 2 * r + 1]
                for n in range(TILE):
                    j = t * TILE + n
                    # int32 before float: numba widens integer ops to int64, which AVX2 cannot
                    # convert to float in vectors (measured 5x slower).
                    q = np.int32(row[n])
                    even[j] = as_f32(srow[j]) * np.float32(np.int32(q & 15)) + as_f32(lrow[j])
                    odd[j] = as_f32(srow[j]) * np.float32(np.int32(q >> 4)) + as_f32(lrow[j])


@njit(**opts)
def dequantize8(codes, scale, low, group, out):
    """One chunk of 8-bit codes [K/8, Nc/T, 8, T] -> float32 W.T [K, Nc]."""
    for p in range(codes.shape[0]):
        for r in range(8):
            kk = p * 8 + r
            srow = scale[kk // group]
            lrow = low[kk // group]
            o = out[kk]
            width = codes.shape[3]
            for t in range(codes.shape[1]):
                row = codes[p, t, r]
                for n in range(width):
                    j = t * width + n
                    o[j] = as_f32(srow[j]) * np.float32(np.int32(row[n])) + as_f32(lrow[j])
