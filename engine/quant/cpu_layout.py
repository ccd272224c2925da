"""Quantized matmuls on the CPU: numba's int8-activation kernel where numba is installed,
else torch's int4 kernel where it applies, measured per shape.

Where numba compiles (kernels/cpu_gemv.py) every quantized matrix takes that module's layout
and nothing else, so memory holds one copy, and every batch and prefill chunk runs its integer
kernel (activations rounded to int8 per 32, as llama.cpp does; see `gemv_matmul`), except a
chunk of BF16_GEMM_MIN_ROWS+ rows on a CPU with AMX: there the matrix is dequantized to
bfloat16 for that chunk and multiplied by oneDNN's AMX GEMM, 6x the int8 kernel's rate.
Measured on the 2-core AVX2 EPYC, one thread, bundled SmolLM2-135M (median of 5 rounds of
process time per call, weights hot in cache, in us; against torch's int4 kernel):

    matrix            M=1           M=4           M=16           M=64
    qkv 960x576       36 vs 124     63 vs 216     245 vs 785     924 vs 3231
    o 576x576         27 vs 69      47 vs 128     200 vs 486     453 vs 1976
    gate_up 3072x576  65 vs 316     151 vs 456    555 vs 2314    2331 vs 8486
    down 576x1536     45 vs 144     100 vs 196    409 vs 766     1555 vs 3359
    head Q8_0 49152   4741 vs 9772  5001 vs 14389 16998 vs 78224 64398 vs 311357

i.e. 2-5x at every batch size (kernels/cpu_simd.py: vpmaddubsw, as llama.cpp multiplies; the
int16 loops before it were on a par with torch's kernel from 4 rows on). The float32 scale and
offset per group cost 2 bits a weight against the int4 layout's 1 (float16 for the formats in
cpu_gemv.HALF_KINDS; a scale alone for the symmetric ones, cpu_gemv.SYMMETRIC_KINDS: Q4_0 and
Q8_0 as many bytes as their file), and Q6_K's 16-element groups need no bfloat16 dense copy (10
bits a weight instead of 16): a Q4_K_M model takes less than in the int4 layout (the planner,
Llama-2-7B's shapes: 5.23 GiB against 5.36).
An engine built with `cpu_quant_kernel="torch"` (EngineConfig), or any engine under
`KVSCOPE_CPU_QUANT_KERNEL=torch`, keeps torch's kernels and never compiles numba's.

torch's kernel, and why its layout is what it is:

torch ships one fast weight-only kernel for x86 CPUs, `aten._weight_int4pack_mm_for_cpu`
(AVX-512 / AVX2, bfloat16 activations; it reads 4-bit codes and per-group bfloat16 scale and
zero and never materialises the weight). Measured on the 2-core development machine (AVX-512
BF16 + AMX), one 4096 x 4096 matrix, one thread:

    rows (M)                   1        16       64       256
    float32 dense  x @ W.T    2.6 ms   12.4     21.9     53.8
    bfloat16 dense            4.1      3.2      4.5      9.9
    int4 kernel, bf16 x       0.9      6.3      26.3     106
    int4 kernel, float32 x    28.9     432      1809     7101   (no vector path: never used)

So the int4 kernel serves decode-sized batches (2.9x faster than float32 at one row, reading an
eighth of the bytes) but its cost grows linearly with M (0.43 ms per row here). Dequantizing the
matrix to bfloat16 in torch costs ~110 ms (bf16 elementwise work is slow on the CPU), after
which oneDNN's bfloat16 GEMM (AMX) takes ~5 ms whatever M: the two cross near 360 rows, one
thread or two (`DEQUANT_MIN_ROWS`), so only long prefill chunks take the dequantizing path.
Prefill of a quantized model on a CPU is therefore compute-bound at a fraction of what a dense
bfloat16 model reaches: a native kernel would fix it; torch ships none. The kernel wants group
sizes of 32..256, so:

  4-bit codes, group >= 32   one int4 matrix (Q4_0, Q4_1, Q4_K, int4)
  8-bit codes, group >= 32   two int4 matrices, high and low nibble, summed (Q8_0, Q5_*, int8):
                             w = 16 s (hi - c) + (s lo + min + 16 s c), each an int4 grid
                             (c centres the high codes; see cpu_layout)
  group 16 (Q6_K)            bfloat16 dense: no torch kernel takes 16-element groups; costs
                             16 bits per weight instead of 8.6

The codes are laid out as that kernel expects ([N/T, K, T/2] bytes, rows r and r + T/2 of each
T-row tile in the low and high nibble), built here directly from the packed format without an
int32 copy of the matrix. T is four of torch's float vectors, so it depends on the CPU torch runs
on: 64 rows with AVX-512, 32 with AVX2. A layout built for the wrong T multiplies without error
and returns garbage, so T is found once by asking torch to pack a probe
(`aten._convert_weight_to_int4pack_for_cpu`) and comparing; where no T matches, every quantized
matrix falls back to bfloat16 dense. Rows are padded to a multiple of 64 (a multiple of every T)
with zero weights.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

from kvscope.engine.quant.cpu_gemv_layout import gemv_layout
from kvscope.engine.quant.packed_readers import codes_of, group_scales_of
from kvscope.kernels import cpu_gemv
from kvscope.kernels.quant_format import QuantizedTensor

INT4_GROUP_SIZES = (32, 64, 128, 256)
TILE_N = 64  # rows are padded to this: a multiple of every kernel tile width below
KERNEL_TILE_WIDTHS = (64, 32, 16)  # AVX-512, AVX2, a 128-bit vector ISA
# From this many rows on, dequantize + bfloat16 GEMM beats the int4 kernel (see above; 4096 x
# 4096, one thread: 0.43 ms per row against ~110 + 5 ms; 11008 x 4096 crosses at the same M).
DEQUANT_MIN_ROWS = 384
# "torch" keeps the int4-kernel layout even where numba is installed (benchmarks compare both).
KERNEL_ENV = "KVSCOPE_CPU_QUANT_KERNEL"


# The engine being built's cpu_quant_kernel (engine/sizing/model_build.py sets it around the build):
# scoped to that build's thread, so the weights it places, and nothing else, follow it.
_BUILD_KERNEL: ContextVar[str] = ContextVar("cpu_quant_kernel", default="auto")


@contextmanager
def kernel_choice(choice: str) -> Iterator[None]:
    """Weights placed inside take `choice`'s layout ("auto" or "torch", EngineConfig's knob)."""
    token = _BUILD_KERNEL.set(choice)
    try:
        yield
    finally:
        _BUILD_KERNEL.reset(token)


def gemv_wanted() -> bool:
    """numba is installed and not switched off (cheap: imports nothing)."""
    if _BUILD_KERNEL.get() == "torch" or os.environ.get(KERNEL_ENV, "auto") == "torch":
        return False
    return cpu_gemv.installed()


def gemv_kernels() -> SimpleNamespace | None:
    """numba's compiled kernels when installed, not switched off and compiling, else None."""
    return cpu_gemv.load() if gemv_wanted() else None


@dataclass(frozen=True)
class Int4Pack:
    """One int4 matrix in the CPU kernel's layout; weight = (q - 8) * scale + zero."""

    packed: torch.Tensor  # uint8 [N_padded / 64 * K, 32] viewed as [N_padded, K / 2]
    scale_zeros: torch.Tensor  # bfloat16 [K / group, N_padded, 2]
    group_size: int
    n: int  # real rows; the rest is padding

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scale_zeros.numel() * 2

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, self.packed, self.group_size, self.scale_zeros
        )
        return y[:, : self.n] if y.shape[1] != self.n else y

    def dequantize_t(self) -> torch.Tensor:
        """W.T in bfloat16, [K, N_padded] (contiguous: the fast operand layout for x @ W.T)."""
        np_, half_k = self.packed.shape
        k, g, t = half_k * 2, self.group_size, kernel_tile_width()
        assert t is not None  # an Int4Pack is only built where torch's layout is known
        v = self.packed.view(np_ // t, k, t // 2).permute(1, 0, 2)  # [K, tiles, T/2]
        q = torch.empty((k, np_ // t, 2, t // 2), dtype=torch.bfloat16)
        q[:, :, 0], q[:, :, 1] = v & 0x0F, v >> 4  # rows r and r + T/2 of each tile
        q = q.view(k // g, g, np_) - 8
        sz = self.scale_zeros  # [K / g, N, 2]: one multiply-add per element, broadcast over g
        return torch.addcmul(sz[:, None, :, 1], q, sz[:, None, :, 0]).view(k, np_)


def _pack_codes(q: torch.Tensor | np.ndarray, tile: int | None = None) -> torch.Tensor:
    """uint8 codes 0..15 [N_padded, K] -> the kernel's [N_padded, K / 2] bytes, in tiles of
    `tile` rows (default: the width this CPU's kernel reads)."""
    q = q.numpy() if isinstance(q, torch.Tensor) else q
    t = tile or kernel_tile_width()
    assert t is not None  # codes are only packed where torch's layout is known
    np_, k = q.shape
    tiles = q.reshape(np_ // t, 2, t // 2, k)
    low, high = tiles[:, 0].transpose(0, 2, 1), tiles[:, 1].transpose(0, 2, 1)  # [tiles, K, T/2]
    return torch.from_numpy((low | (high << 4)).reshape(np_, k // 2))


@functools.cache
def kernel_tile_width() -> int | None:
    """Rows per tile in torch's int4 CPU layout on this machine; None when torch cannot pack
    here or packs in a layout we do not know (then quantized weights run as bfloat16 dense)."""
    probe = torch.randint(0, 16, (TILE_N, 64), dtype=torch.int32, generator=torch.Generator())
    try:
        expected = torch.ops.aten._convert_weight_to_int4pack_for_cpu(probe, 1)
    except (RuntimeError, NotImplementedError, AttributeError):
        return None
    for t in KERNEL_TILE_WIDTHS:
        if torch.equal(_pack_codes(probe.to(torch.uint8), t), expected):
            return t
    return None


def int4_kernel_available() -> bool:
    return kernel_tile_width() is not None


def _scale_zeros(scale: np.ndarray, low: np.ndarray) -> torch.Tensor:
    """float32 per-group scale and min [N, K / g] -> the kernel's bf16 [K / g, N, 2]."""
    both = np.stack([scale, low + 8 * scale], axis=-1).transpose(1, 0, 2)
    return torch.from_numpy(np.ascontiguousarray(both)).to(torch.bfloat16)


@dataclass(frozen=True)
class CpuQuantLinear:
    """A quantized weight in a CPU kernel's layout: numba's (`gemv`), one or two Int4Packs, or
    bf16 dense. Only one of them is built: never two copies of a matrix."""

    parts: tuple[Int4Pack, ...]
    dense: torch.Tensor | None  # bfloat16 [N, K] for formats no int4 kernel takes
    n: int
    kind: str
    gemv: cpu_gemv.QuantizedCodesT | None = None

    @property
    def nbytes(self) -> int:
        if self.gemv is not None:
            return self.gemv.nbytes
        if self.dense is not None:
            return self.dense.numel() * 2
        return sum(p.nbytes for p in self.parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.gemv is not None:
            return gemv_matmul(self.gemv, x)
        if self.dense is not None:
            # [N, K] through F.linear: 2.5x faster than x @ [K, N] for a 49k-row bf16 head at
            # one row (10.9 vs 27.5 ms), no slower elsewhere.
            return F.linear(x, self.dense)
        if x.shape[0] >= DEQUANT_MIN_ROWS:
            w_t = self.parts[0].dequantize_t()
            for part in self.parts[1:]:
                w_t += part.dequantize_t()
            return x @ w_t[:, : self.n]
        y = self.parts[0].matmul(x)
        for part in self.parts[1:]:
            y += part.matmul(x)
        return y


# From this many rows on (a prefill chunk, or one beside decodes), where torch's bfloat16 GEMM
# runs on AMX, the matrix is dequantized to bfloat16 (kernels/cpu_gemv.dequantize_bf16) for one
# GEMM instead of the int8 kernel (the crossover measured per step: PERFORMANCE.md, "AMX
# prefill"). Where no AMX is (an AVX2 EPYC), torch's bfloat16 GEMM has no fast path and the int8
# kernel keeps every row.
BF16_GEMM_MIN_ROWS = 128
CPUINFO = Path("/proc/cpuinfo")


@functools.cache
def bf16_gemm_fast() -> bool:
    """Whether this CPU multiplies bfloat16 matrices with AMX tiles (Linux: the CPU lists
    amx_bf16 and the kernel grants the tile permission torch asks for)."""
    try:
        if "amx_bf16" not in CPUINFO.read_text(encoding="utf-8"):
            return False
    except OSError:  # not Linux: the int8 kernel everywhere
        return False
    init = getattr(torch._C._cpu, "_init_amx", None)
    return bool(init and init())


def gemv_matmul(w: cpu_gemv.QuantizedCodesT, x: torch.Tensor) -> torch.Tensor:
    """x [M, K] (bfloat16) @ W.T through numba's layout, in x's dtype, at any M: the integer
    kernel, except for long chunks where AMX multiplies bfloat16 (BF16_GEMM_MIN_ROWS). It beats
    dequantizing to float32 for a GEMM at every batch and prefill chunk measured
    (bundled model, one thread; kernel vs dequantize + GEMM: gate_up M = 32 1.5 vs 7.5 ms, 512
    20 vs 37 ms; the Q8_0 head 22 vs 201 ms at 32, 487 vs 682 ms at 512)."""
    ns = cpu_gemv.load()
    assert ns is not None  # `w` is in numba's layout: built only once load() gave the kernels
    threads = torch.get_num_threads()
    if x.shape[0] >= BF16_GEMM_MIN_ROWS and bf16_gemm_fast():
        bits = cpu_gemv.dequantize_bf16(ns, w, threads)
        dense = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)[: w.n]
        return F.linear(x.to(torch.bfloat16), dense).to(x.dtype)
    if x.dtype == torch.bfloat16:  # the engine's case: bits in, bits out, no torch op
        bits = cpu_gemv.matmul_bf16(ns, w, x.view(torch.int16).numpy().view(np.uint16), threads)
        return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    y = cpu_gemv.columns(cpu_gemv.matmul(ns, w, x.float().numpy(), threads), w.n)
    return torch.from_numpy(np.ascontiguousarray(y)).to(x.dtype)


def cpu_layout(w: QuantizedTensor) -> CpuQuantLinear:
    """The fastest CPU layout for `w` (see the module docstring), built chunk by chunk."""
    n, k = w.shape
    g = w.group_size
    if gemv_kernels() is not None:
        return CpuQuantLinear((), None, n, w.kind, gemv_layout(w))
    if g not in INT4_GROUP_SIZES or not int4_kernel_available():
        return CpuQuantLinear((), _dense(w), n, w.kind)
    np_ = -(-n // TILE_N) * TILE_N
    halves = 1 if w.bits == 4 else 2
    packed = [torch.empty((np_, k // 2), dtype=torch.uint8) for _ in range(halves)]
    scale_zeros = [torch.zeros((k // g, np_, 2), dtype=torch.bfloat16) for _ in range(halves)]
    # The high nibbles' centre (see below), one per matrix: the codes in use, e.g. 0..1 (5-bit).
    c = (int(w.codes.max()) >> 4) if w.bits == 8 else 0
    c = (c + 1) // 2
    rows_per_chunk = max(TILE_N, (1 << 22) // k // TILE_N * TILE_N)
    for start in range(0, np_, rows_per_chunk):
        stop = min(np_, start + rows_per_chunk)
        real = slice(start, min(stop, n))
        count = max(0, real.stop - real.start)
        q = np.zeros((stop - start, k), dtype=np.uint8)
        scale = np.zeros((stop - start, k // g), dtype=np.float32)
        low = np.zeros_like(scale)
        if count:
            q[:count] = codes_of(w, real)
            scale[:count], low[:count] = group_scales_of(w, real)
        pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
        if w.bits == 4:
            pieces = [(q, scale, low)]
        else:
            # w = s q + m = 16 s (hi - c) + (s lo + m + 16 s c). The kernel computes
            # (code - 8) * scale + zero; storing hi + 8 - c makes the high part's zero exactly 0,
            # with c the middle of the codes in use (8 for 8-bit, 1 for 5-bit): a large zero
            # cancelling a large product would lose most of bfloat16's 8 bits (measured: 8% of
            # the logit range on a Q5_0 model, against 0.9% this way; bfloat16 dense: 0.6%).
            pieces = [
                ((q >> 4) + np.uint8(8 - c), 16 * scale, -128 * scale),
                (q & 0x0F, scale, low + 16 * c * scale),
            ]
        for i, (codes, sc, m) in enumerate(pieces):
            packed[i][start:stop] = _pack_codes(codes)
            scale_zeros[i][:, start:stop] = _scale_zeros(sc, m)
    parts = tuple(Int4Pack(p, sz, g, n) for p, sz in zip(packed, scale_zeros, strict=True))
    return CpuQuantLinear(parts, None, n, w.kind)


def _dense(w: QuantizedTensor) -> torch.Tensor:
    n, k = w.shape
    out = torch.empty((n, k), dtype=torch.bfloat16)
    step = max(1, (1 << 22) // k)
    for start in range(0, n, step):
        rows = slice(start, min(n, start + step))
        q = codes_of(w, rows).reshape(-1, k // w.group_size, w.group_size).astype(np.float32)
        scale, low = group_scales_of(w, rows)
        values = (q * scale[..., None] + low[..., None]).reshape(-1, k)
        out[rows] = torch.from_numpy(values)
    return out
