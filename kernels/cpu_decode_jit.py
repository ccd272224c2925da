"""numba kernels for the glue of one decode step of a Llama-family layer on the CPU: everything
between the quantized matmuls (kernels/cpu_gemv_jit.py), in float32, on numpy arrays.

Why: at decode a layer's glue is ~60 small torch ops (norms, RoPE, the K/V store, a gathered
attention, SiLU, residuals) whose dispatch costs more than their arithmetic: measured 28 of the
50 ms of a bundled-model step at one thread, against 22 ms of matmuls. Here each stretch between
two matmuls is one call, and its output is already the next matmul's int8-rounded input.

The KV pool is bfloat16, read and written as its bits (uint16): `cache[block, offset, kv_head]`
is one head's row of D values, as the torch reference lays it out (kernels/torch_ref.py).
Imported only through kernels/cpu_decode.py, which keeps numba optional. As in
kernels/cpu_gemv_jit.py, the annotations are for the reader: numba compiles for what is passed.
"""

from __future__ import annotations

import math
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
from numba import njit, prange

from kvscope.kernels.cpu_gemv_jit import (
    TILE,
    Bf16Array,
    Codes4,
    Codes8,
    opts,
    quantize_rows,
    rounded4,
    rounded4_parallel,
    rounded8,
    rounded8_parallel,
)
from kvscope.kernels.cpu_meta import Offsets, Scales
from kvscope.kernels.cpu_simd import Float32Array, Int8Array, prefetch

Int32Array: TypeAlias = npt.NDArray[np.int32]

LOG2E = np.float32(1.4426950408889634)
# 2^f = e^(f ln 2) for f in [0, 1): its Taylor terms (ln 2)^k / k! to k = 6, relative error
# under 2e-5 (the last term left out, (ln 2)^7 / 7!), far below the bfloat16 K/V's 4e-3.
EXP2 = (
    np.float32(1.0),
    np.float32(0.6931471805599453),
    np.float32(0.2402265069591007),
    np.float32(0.05550410866482158),
    np.float32(0.009618129107628477),
    np.float32(0.0013333558146428443),
    np.float32(0.00015403530393381608),
)
FLUSH_EXP2 = np.float32(-64.0)  # softmax weights below 2^-64 of the top one count as 0
BF16_ROUND = np.uint32(0x7FFF)
SIXTEEN = np.uint32(16)
ONE = np.uint32(1)


@njit(**opts)
def add_norm_quantize(
    h: Float32Array,
    delta: Float32Array,
    weight: Float32Array,
    eps: float,
    act_group: int,
    x: Float32Array,
    xq: Int8Array,
    xd: Float32Array,
    xs: Float32Array,
) -> None:
    """h += delta (skipped when delta has no rows), then x = RMSNorm(h) * weight, rounded to
    int8 per act_group into xq/xd/xs (the next matmul's input). h, delta, x: float32 [M, H]."""
    m_rows, width = h.shape
    for m in range(m_rows):
        hm = h[m]
        if delta.shape[0]:
            dm = delta[m]
            for j in range(width):
                hm[j] += dm[j]
        total = np.float32(0.0)
        for j in range(width):
            total += hm[j] * hm[j]
        inv = np.float32(1.0) / np.float32(math.sqrt(total / np.float32(width) + eps))
        xm = x[m]
        for j in range(width):
            xm[j] = hm[j] * inv * weight[j]
    quantize_rows(x, act_group, xq, xd, xs)


@njit(**opts)
def add_rows(h: Float32Array, delta: Float32Array) -> None:
    """h += delta, float32 [M, H] (the last layer's down projection into the residual)."""
    for m in range(h.shape[0]):
        for j in range(h.shape[1]):
            h[m, j] += delta[m, j]


@njit(**opts)
def norm_rows(h: Float32Array, weight: Float32Array, eps: float, out: Float32Array) -> None:
    """out = RMSNorm(h) * weight, float32 [M, H] (the model's final norm)."""
    m_rows, width = h.shape
    for m in range(m_rows):
        total = np.float32(0.0)
        for j in range(width):
            total += h[m, j] * h[m, j]
        inv = np.float32(1.0) / np.float32(math.sqrt(total / np.float32(width) + eps))
        for j in range(width):
            out[m, j] = h[m, j] * inv * weight[j]


@njit(**opts)
def silu_mul_quantize(
    gate_up: Float32Array,
    x: Float32Array,
    act_group: int,
    xq: Int8Array,
    xd: Float32Array,
    xs: Float32Array,
) -> None:
    """x = silu(gate) * up for gate_up = [gate | up] float32 [M, 2I], rounded to int8."""
    m_rows, inter = x.shape
    for m in range(m_rows):
        g = gate_up[m]
        xm = x[m]
        for j in range(inter):
            a = g[j]
            xm[j] = a / (np.float32(1.0) + np.float32(math.exp(-a))) * g[inter + j]
    quantize_rows(x, act_group, xq, xd, xs)


@njit(**opts)
def _scatter(tmp: Float32Array, y: Float32Array, col0: int, n: int) -> None:
    """Columns [col0, col0 + n) of y [M, N] from a matmul's [chunks, M, Nc] output."""
    chunks, m_rows, width = tmp.shape
    for c in range(chunks):
        stop = min(width, n - c * width)
        for m in range(m_rows):
            for j in range(stop):
                y[m, col0 + c * width + j] = tmp[c, m, j]


@njit(**opts)
def project4(
    codes: Codes4,
    scale: Scales,
    low: Offsets,
    group: int,
    n: int,
    xq: Int8Array,
    xd: Float32Array,
    xs: Float32Array,
    y: Float32Array,
    col0: int,
) -> None:
    """Columns [col0, col0 + n) of y float32 [M, N] = int8 activations @ one 4-bit matrix
    (kernels/cpu_gemv.py's layout, on one thread)."""
    tmp = np.empty((codes.shape[0], xq.shape[0], codes.shape[1] * TILE), np.float32)
    rounded4(codes, scale, low, xq, xd, xs, group, tmp)
    _scatter(tmp, y, col0, n)


@njit(**opts)
def project8(
    codes: Codes8,
    scale: Scales,
    low: Offsets,
    group: int,
    n: int,
    xq: Int8Array,
    xd: Float32Array,
    xs: Float32Array,
    y: Float32Array,
    col0: int,
) -> None:
    """project4 for centred 8-bit codes."""
    tmp = np.empty((codes.shape[0], xq.shape[0], codes.shape[1] * TILE), np.float32)
    rounded8(codes, scale, low, xq, xd, xs, group, tmp)
    _scatter(tmp, y, col0, n)


@njit(**opts)
def project4_parallel(
    codes: Codes4,
    scale: Scales,
    low: Offsets,
    group: int,
    n: int,
    xq: Int8Array,
    xd: Float32Array,
    xs: Float32Array,
    y: Float32Array,
    col0: int,
) -> None:
    """project4 with the chunks shared among numba's threads."""
    tmp = np.empty((codes.shape[0], xq.shape[0], codes.shape[1] * TILE), np.float32)
    rounded4_parallel(codes, scale, low, xq, xd, xs, group, tmp)
    _scatter(tmp, y, col0, n)


@njit(**opts)
def project8_parallel(
    codes: Codes8,
    scale: Scales,
    low: Offsets,
    group: int,
    n: int,
    xq: Int8Array,
    xd: Float32Array,
    xs: Float32Array,
    y: Float32Array,
    col0: int,
) -> None:
    tmp = np.empty((codes.shape[0], xq.shape[0], codes.shape[1] * TILE), np.float32)
    rounded8_parallel(codes, scale, low, xq, xd, xs, group, tmp)
    _scatter(tmp, y, col0, n)


@njit(**opts)
def _exp_below_zero(x: Float32Array, scratch: Int32Array) -> None:
    """x = exp(x) in place for x <= 0 (softmax scores less their max): 2^(x log2 e) as a
    polynomial in the fraction times 2^integer built from its bits. Plain arithmetic, so LLVM
    vectorises it, where math.exp is a libm call per score (measured ~40% of a 2048-token
    attention). Below 2^FLUSH_EXP2 (e^-44, 5e-20 of the top score's weight) it gives exactly 0:
    the tiny weights it would give instead become subnormal floats once normalised and
    multiplied with V, and every operation on a subnormal takes a microcode assist (measured:
    a decode step's 22 attentions on a 52-token context took 8.7 ms instead of 0.6)."""
    n = x.shape[0]
    exponent = scratch[:n]
    c0, c1, c2, c3, c4, c5, c6 = EXP2
    for j in range(n):
        t = x[j] * LOG2E
        keep = t > FLUSH_EXP2
        t = max(t, FLUSH_EXP2)
        k = np.floor(t)
        f = t - k
        x[j] = c0 + f * (c1 + f * (c2 + f * (c3 + f * (c4 + f * (c5 + f * c6)))))
        # float bits 0 are 0.0
        exponent[j] = ((np.int32(k) + np.int32(127)) << np.int32(23)) if keep else np.int32(0)
    powers = exponent.view(np.float32)
    for j in range(n):
        x[j] *= powers[j]


@njit(**opts)
def _head_norm(row: Float32Array, base: int, d: int, weight: Float32Array, eps: float) -> None:
    total = np.float32(0.0)
    for i in range(d):
        total += row[base + i] * row[base + i]
    inv = np.float32(1.0) / np.float32(math.sqrt(total / np.float32(d) + eps))
    for i in range(d):
        row[base + i] = row[base + i] * inv * weight[i]


@njit(**opts)
def _rotate(row: Float32Array, base: int, half: int, cos: Float32Array, sin: Float32Array) -> None:
    """HF's rotate_half RoPE on one head, in place: x * cos + rotate_half(x) * sin."""
    for i in range(half):
        a = row[base + i]
        b = row[base + half + i]
        row[base + i] = a * cos[i] - b * sin[i]
        row[base + half + i] = b * cos[half + i] + a * sin[half + i]


@njit(**opts)
def _store_bf16(bits: npt.NDArray[np.uint32], dest: Bf16Array, base: int, d: int) -> None:
    """dest[0:d] (uint16) = float32 values [base, base + d) of a row, given as its uint32 view
    `bits`, rounded to bfloat16 (to nearest even)."""
    for i in range(d):
        v = bits[base + i]
        v += BF16_ROUND + ((v >> SIXTEEN) & ONE)
        dest[i] = np.uint16(v >> SIXTEEN)


@njit(**opts)
def _load_bf16(src: Bf16Array, out_bits: npt.NDArray[np.uint32], d: int) -> None:
    for i in range(d):
        out_bits[i] = np.uint32(src[i]) << SIXTEEN


@njit(inline="always", **opts)
def _rope_store(
    m: int,
    qkv: Float32Array,
    bias: Float32Array,
    q_norm: Float32Array,
    k_norm: Float32Array,
    eps: float,
    cos: Float32Array,
    sin: Float32Array,
    k_cache: Bf16Array,
    v_cache: Bf16Array,
    slots: npt.NDArray[np.int64],
    hq: int,
    hkv: int,
) -> None:
    """Row m of qkv: bias, per-head q/k norm, RoPE; K and V stored at slots[m] (-1: padding)."""
    block_size, d = k_cache.shape[1], k_cache.shape[3]
    bits = qkv.view(np.uint32)
    row = qkv[m]
    if bias.shape[0]:
        for j in range(row.shape[0]):
            row[j] += bias[j]
    for head in range(hq + hkv):
        if q_norm.shape[0]:
            _head_norm(row, head * d, d, q_norm if head < hq else k_norm, eps)
        _rotate(row, head * d, d // 2, cos[m], sin[m])
    slot = slots[m]
    if slot >= 0:
        block, offset = slot // block_size, slot % block_size
        for g in range(hkv):
            _store_bf16(bits[m], k_cache[block, offset, g], (hq + g) * d, d)
            _store_bf16(bits[m], v_cache[block, offset, g], (hq + hkv + g) * d, d)


AHEAD = 16  # positions prefetched ahead in the attention's passes over K and V
LINE = 32  # uint16 elements per 64-byte cache line


@njit(inline="always", **opts)
def _prefetch_position(
    flat: Bf16Array, table: Int32Array, j: int, length: int, block_size: int, position: int
) -> None:
    """Prefetch position j's K or V (every head: `position` elements) if j < length."""
    if j < length:
        at = (table[j // block_size] * block_size + j % block_size) * position
        for e in range(0, position, LINE):
            prefetch(flat, at + e)


# Inlined: called as a function, numba compiled its loops 5x slower (286 against 57 us for a
# 170-token context; its arguments arrive as opaque array structs).
@njit(inline="always", **opts)
def _attend(
    m: int,
    qkv: Float32Array,
    k_cache: Bf16Array,
    v_cache: Bf16Array,
    block_tables: Int32Array,
    seq_lens: Int32Array,
    window: int,
    scale: np.float32,
    hq: int,
    hkv: int,
    out: Float32Array,
) -> None:
    """Row m's query heads attend to its sequence's first seq_lens[m] positions (only the last
    `window` when window > 0) through block_tables[m]. Position by position, every KV head of a
    position in turn: the pool holds a position's heads side by side, so the reads run through
    each block in order (head by head, a position's K was read from three places 384 bytes
    apart: 227 against 55 us a layer for a 180-token context out of cache, where decode finds
    it after streaming the weights)."""
    block_size, d = k_cache.shape[1], k_cache.shape[3]
    per_kv = hq // hkv
    row, om = qkv[m], out[m]
    kv_row = np.empty(d, np.float32)
    kv_bits = kv_row.view(np.uint32)
    length = seq_lens[m]
    start = max(0, length - window) if window > 0 else 0
    scores = np.empty((hq, length - start), np.float32)
    exponent = np.empty(length - start, np.int32)
    flat_k, flat_v = k_cache.reshape(-1), v_cache.reshape(-1)
    position = hkv * d  # elements of one position's K (or V), all heads
    for j in range(start, length):
        block, offset = block_tables[m, j // block_size], j % block_size
        _prefetch_position(flat_k, block_tables[m], j + AHEAD, length, block_size, position)
        for g in range(hkv):
            _load_bf16(k_cache[block, offset, g], kv_bits, d)
            for r in range(per_kv):
                base = (g * per_kv + r) * d
                s = np.float32(0.0)
                for i in range(d):
                    s += row[base + i] * kv_row[i]
                scores[g * per_kv + r, j - start] = s * scale
    for head in range(hq):
        sr = scores[head]
        top = sr.max()
        for j in range(sr.shape[0]):
            sr[j] -= top
        _exp_below_zero(sr, exponent)
        total = np.float32(0.0)
        for j in range(sr.shape[0]):
            total += sr[j]
        inv = np.float32(1.0) / total
        for j in range(sr.shape[0]):
            sr[j] *= inv
        for i in range(d):
            om[head * d + i] = 0.0
    for j in range(start, length):
        block, offset = block_tables[m, j // block_size], j % block_size
        _prefetch_position(flat_v, block_tables[m], j + AHEAD, length, block_size, position)
        for g in range(hkv):
            _load_bf16(v_cache[block, offset, g], kv_bits, d)
            for r in range(per_kv):
                head = g * per_kv + r
                p = scores[head, j - start]
                for i in range(d):
                    om[head * d + i] += p * kv_row[i]


@njit(**opts)
def rope_store_attend(
    qkv: Float32Array,
    bias: Float32Array,
    q_norm: Float32Array,
    k_norm: Float32Array,
    eps: float,
    cos: Float32Array,
    sin: Float32Array,
    k_cache: Bf16Array,
    v_cache: Bf16Array,
    slots: npt.NDArray[np.int64],
    block_tables: Int32Array,
    seq_lens: Int32Array,
    window: int,
    scale: np.float32,
    hq: int,
    hkv: int,
    out: Float32Array,
    act_group: int,
    xq: Int8Array,
    xd: Float32Array,
    xs: Float32Array,
) -> None:
    """One decode token per row of qkv = [q | k | v] float32 [M, (hq + 2 hkv) D]: bias, per-head
    q/k norm (Qwen3; skipped when the weights are empty), RoPE with cos/sin [M, D]; K and V are
    stored at slots[m] (-1: padding, not stored) and row m attends to its sequence's first
    seq_lens[m] positions through block_tables[m] (only the last `window` when window > 0: a
    sliding window, whose earlier table entries may be stale and are not read). The output
    [M, hq D] is rounded to int8 for o_proj. k_cache/v_cache: uint16 bfloat16 bits
    [blocks, block_size, hkv, D]."""
    for m in range(qkv.shape[0]):
        _rope_store(m, qkv, bias, q_norm, k_norm, eps, cos, sin, k_cache, v_cache, slots, hq, hkv)
        _attend(m, qkv, k_cache, v_cache, block_tables, seq_lens, window, scale, hq, hkv, out)
    quantize_rows(out, act_group, xq, xd, xs)


@njit(parallel=True, **opts)
def rope_store_attend_parallel(
    qkv: Float32Array,
    bias: Float32Array,
    q_norm: Float32Array,
    k_norm: Float32Array,
    eps: float,
    cos: Float32Array,
    sin: Float32Array,
    k_cache: Bf16Array,
    v_cache: Bf16Array,
    slots: npt.NDArray[np.int64],
    block_tables: Int32Array,
    seq_lens: Int32Array,
    window: int,
    scale: np.float32,
    hq: int,
    hkv: int,
    out: Float32Array,
    act_group: int,
    xq: Int8Array,
    xd: Float32Array,
    xs: Float32Array,
) -> None:
    """rope_store_attend with the rows shared among numba's threads: every row's K/V is stored
    first, and a row reads only its own sequence's blocks (a shared prefix is read, never
    written, by two rows)."""
    m_rows = qkv.shape[0]
    for m in range(m_rows):
        _rope_store(m, qkv, bias, q_norm, k_norm, eps, cos, sin, k_cache, v_cache, slots, hq, hkv)
    for m in prange(m_rows):
        _attend(m, qkv, k_cache, v_cache, block_tables, seq_lens, window, scale, hq, hkv, out)
    quantize_rows(out, act_group, xq, xd, xs)
