"""Weight-only quantized matmul in Triton: y = x @ W.T with W a `QuantizedTensor`, dequantized
inside the GEMM (W is never written out in float), float32 accumulation, y in x's dtype.

One kernel, `_quant_matmul_kernel`, covers every layout `QuantizedTensor` allows that a GPU
engine meets: 4-bit (two codes per byte, low nibble first) or 8-bit codes; groups of 16, 32, 64
or 128; super-groups of any multiple of the group (d/dmin per super-group, float16 or float32);
int8 sub-scales and sub-mins present or not, the sub-min possibly the very tensor of the
sub-scale (Q6_K: loaded once). The layout's booleans and sizes are constexprs and the d/dmin
dtype is part of the pointer type, so each layout compiles to its own straight-line kernel.

Program (m tile, n tile) walks K in BLOCK_K steps. Tiles and groups are powers of two, so they
nest: a tile covers BLOCK_K / G whole groups, or lies inside one group (G > BLOCK_K).

    x tile     [BLOCK_M, BLOCK_K]  x's dtype; rows past M masked to 0
    codes      [BLOCK_N, BLOCK_K]  uint8; 4-bit bytes [BLOCK_N, BLOCK_K / 2] are split into
                                   their nibbles and interleaved back (`tl.join` + reshape)
    scale/min  [BLOCK_N, groups]   d[g // (S/G)] * sub_scale[g] and dmin[...] * sub_min[g], in
                                   float32
    W tile     q * scale + min in float32, over a [BLOCK_N, groups, span] view of the codes:
               the float32 operations of `QuantizedTensor.dequantize`, so W is exact for every
               GGUF type (a GPU may fuse the multiply-add, which can move the engine's own
               int4/int8 weights, whose d is float32, by an ulp of float32); then cast to x's
               dtype
    acc       += tl.dot(x tile, W tile.T), float32 [BLOCK_M, BLOCK_N]

Scaling the tile before `tl.dot` (rather than scaling per-group partial dots) keeps BLOCK_K
independent of G and multiplies exactly the W that the torch reference `quantized_matmul_torch`
multiplies: the two differ only in summation order.

The dot dtype is x's. float16/bfloat16 run on tensor cores from sm_80 on (mma, wgmma on sm_90);
float32 x keeps IEEE float32 products ("ieee": TF32 would cost float32 models ~3 decimal digits,
as in the attention kernels), which Triton computes with FMAs. Below sm_80 this Triton lowers
every `tl.dot`, float16 included, to FMAs, so bfloat16 (which Turing's tensor cores lack) needs
no cast there: it compiles and runs like float16.

Tile shapes (`quant_matmul_meta`), by M and by whether the dot is on tensor cores or FMAs
(float32 x, or any x below sm_80; the launcher asks Triton's driver for the target):

               tensor cores                         FMA dots
    decode     16 x 32 x 128, 4 warps, 3 stages     16 x 32 x 32, 4 warps, 3 stages
    prefill    128 x 64 x 64, 8 warps, 3 stages     64 x 64 x 32, 8 warps, 2 stages
               (BLOCK_M x BLOCK_N x BLOCK_K)

  decode (M <= 64): BLOCK_M is tl.dot's minimum, 16. A skinny GEMM is a read of W, so the tile
      is narrow in N (more programs over N) and long in K; M tiles are grid axis 0, so the
      programs sharing a W tile run together and find it in L2. No split-K: the engine fuses
      q/k/v and gate/up, so N is thousands of rows. An FMA dot holds its operands in registers:
      BLOCK_K 128 spills there, 32 does not.
  prefill (M > 64): every dequantized W tile serves 128 rows of x (64 for FMA dots).

With these tiles no configuration spills registers, and shared memory stays within every
target's limit (64 KiB on sm_75, ~99 KiB on sm_86/89/120): `tests/kernels/test_triton_aot.py`
compiles the launcher's exact arguments for sm_75..sm_120 and checks it. Row indices are widened to
int64 before they meet a stride: an lm_head's codes (vocab x hidden) can pass 2**31 bytes.

Triton's interpreter multiplies bfloat16 dot operands as raw integers and truncates float32 to
bfloat16, so there (`EMULATE_BF16`, never on a GPU) the bfloat16 case rounds W and y to
bfloat16 by hand and multiplies in float32: bfloat16 products are exact in float32, so the sums
are a bfloat16 dot's.
"""

from __future__ import annotations

from typing import TypedDict

import torch
import triton
import triton.language as tl
from triton.runtime.driver import driver

from kvscope.kernels.quant_format import QuantizedTensor
from kvscope.kernels.triton_common import INTERPRETED, dot_precision, jit, last_dim_contiguous

# Layouts the kernel takes; every GGUF type uses 16 or 32, the engine's own int4/int8 128.
SUPPORTED_GROUP_SIZES = (16, 32, 64, 128)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
DECODE_MAX_M = 64  # up to this many rows of x: the decode tile shape


class LayoutMeta(TypedDict):
    """A weight's layout, as `quant_matmul_meta` takes it (`layout_meta`)."""

    bits: int
    group_size: int
    groups_per_super: int
    has_sub_scale: bool
    has_sub_min: bool
    shared_sub: bool


class QuantMatmulMeta(TypedDict):
    """`_quant_matmul_kernel`'s constexprs and launch options (`quant_matmul_meta`)."""

    BITS: int
    GROUP: int
    GROUPS_PER_SUPER: int
    HAS_SUB_SCALE: bool
    HAS_SUB_MIN: bool
    SHARED_SUB: bool
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    DOT_PRECISION: str
    EMULATE_BF16: bool
    num_warps: int
    num_stages: int


@jit
def _round_to_bf16(x: tl.tensor) -> tl.tensor:
    """Round float32 to the nearest bfloat16 (ties to even), still in float32: the cast that
    follows is then exact. Only for the interpreter, which truncates float32 -> bfloat16."""
    bits = x.to(tl.int32, bitcast=True)
    lsb = (bits >> 16) & 1
    return ((bits + 0x7FFF + lsb) & -0x10000).to(tl.float32, bitcast=True)


@jit
def _quant_matmul_kernel(
    x_ptr: tl.tensor,
    codes_ptr: tl.tensor,
    d_ptr: tl.tensor,
    dmin_ptr: tl.tensor,
    sub_scale_ptr: tl.tensor,
    sub_min_ptr: tl.tensor,
    out_ptr: tl.tensor,
    M: tl.tensor,
    N: tl.tensor,
    K: tl.tensor,
    stride_xm: tl.tensor,
    stride_cn: tl.tensor,
    stride_dn: tl.tensor,
    stride_mn: tl.tensor,
    stride_sn: tl.tensor,
    stride_tn: tl.tensor,
    stride_om: tl.tensor,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUPS_PER_SUPER: tl.constexpr,
    HAS_SUB_SCALE: tl.constexpr,
    HAS_SUB_MIN: tl.constexpr,
    SHARED_SUB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EMULATE_BF16: tl.constexpr,
) -> None:
    """Program (m tile, n tile): out[m tile, n tile] = x[m tile] @ W[n tile].T over all of K."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    rows64 = rows.to(tl.int64)
    cols64 = cols.to(tl.int64)
    x_rows = x_ptr + rows64[:, None] * stride_xm
    code_rows = codes_ptr + cols64[:, None] * stride_cn
    d_rows = d_ptr + cols64[:, None] * stride_dn
    dmin_rows = dmin_ptr + cols64[:, None] * stride_mn
    sub_rows = sub_scale_ptr + cols64[:, None] * stride_sn
    submin_rows = sub_min_ptr + cols64[:, None] * stride_tn
    # Groups a K tile covers, and how many of its elements each: BLOCK_K // GROUP groups when
    # the tile spans several, else one (a tile inside a group: powers of two nest).
    TILE_GROUPS: tl.constexpr = BLOCK_K // GROUP if BLOCK_K >= GROUP else 1
    SPAN: tl.constexpr = BLOCK_K // TILE_GROUPS

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        # K is a whole number of groups, and tiles and groups nest (powers of two): a tile's
        # groups are either entirely inside K or entirely past it, so masking by element or by
        # group agrees.
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows + ks[None, :], mask=row_mask[:, None] & (ks[None, :] < K), other=0.0)
        if BITS == 4:
            kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            packed = tl.load(
                code_rows + kb[None, :],
                mask=col_mask[:, None] & (kb[None, :] < K // 2),
                other=0,
            )
            # element 2j is byte j's low nibble, 2j + 1 its high nibble
            q = tl.reshape(tl.join(packed & 0x0F, packed >> 4), [BLOCK_N, BLOCK_K])
        else:
            q = tl.load(
                code_rows + ks[None, :], mask=col_mask[:, None] & (ks[None, :] < K), other=0
            )

        g = (k0 + tl.arange(0, TILE_GROUPS) * SPAN) // GROUP
        g_mask = col_mask[:, None] & (g[None, :] < K // GROUP)
        sg = g // GROUPS_PER_SUPER
        # Masked groups get scale 0 and min 0: W is 0 there, finite, whatever x holds.
        scale = tl.load(d_rows + sg[None, :], mask=g_mask, other=0.0).to(tl.float32)
        low = tl.load(dmin_rows + sg[None, :], mask=g_mask, other=0.0).to(tl.float32)
        if HAS_SUB_SCALE:
            sub = tl.load(sub_rows + g[None, :], mask=g_mask, other=0).to(tl.float32)
            scale = scale * sub
        if HAS_SUB_MIN:
            if SHARED_SUB:
                low = low * sub
            else:
                low = low * tl.load(submin_rows + g[None, :], mask=g_mask, other=0).to(tl.float32)

        w = tl.reshape(q.to(tl.float32), [BLOCK_N, TILE_GROUPS, SPAN])
        w = w * scale[:, :, None] + low[:, :, None]
        w = tl.reshape(w, [BLOCK_N, BLOCK_K])
        if EMULATE_BF16:
            # bf16 x W products are exact in float32: the same sums as a bf16 dot
            w = _round_to_bf16(w)
            acc = tl.dot(x.to(tl.float32), tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc, input_precision=DOT_PRECISION)

    if EMULATE_BF16:
        acc = _round_to_bf16(acc)
    out_ptrs = out_ptr + rows64[:, None] * stride_om + cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


def target_arch() -> int | None:
    """The compute capability Triton compiles for now (75, 80, 90, ...: the current CUDA device's,
    where every launch goes); None in the interpreter."""
    if INTERPRETED:
        return None
    arch: int = driver.active.get_current_target().arch
    return arch


def quant_matmul_meta(
    m: int,
    dtype: torch.dtype,
    arch: int | None,
    bits: int,
    group_size: int,
    groups_per_super: int,
    has_sub_scale: bool,
    has_sub_min: bool,
    shared_sub: bool,
) -> QuantMatmulMeta:
    """`_quant_matmul_kernel`'s constexprs and launch options (num_warps, num_stages) for M rows
    of x in `dtype` times a weight of the given layout on compute capability `arch` (None: the
    interpreter): what `quantized_matmul_triton` launches with, and what
    `tests/kernels/test_triton_aot.py` compiles."""
    wide = dtype == torch.float32
    # FMA dots (float32 x; every dtype below sm_80) want short K tiles: an FMA dot holds its
    # operands in registers, and long tiles spill.
    fma = wide or (arch is not None and arch < 80)
    if m <= DECODE_MAX_M:
        block_m, block_n, block_k = (16, 32, 32) if fma else (16, 32, 128)
        num_warps, num_stages = 4, 3
    elif fma:
        block_m, block_n, block_k = 64, 64, 32
        num_warps, num_stages = 8, 2
    else:
        block_m, block_n, block_k = 128, 64, 64
        num_warps, num_stages = 8, 3
    return QuantMatmulMeta(
        BITS=bits,
        GROUP=group_size,
        GROUPS_PER_SUPER=groups_per_super,
        HAS_SUB_SCALE=has_sub_scale,
        HAS_SUB_MIN=has_sub_min,
        SHARED_SUB=shared_sub,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        DOT_PRECISION=dot_precision(dtype),
        EMULATE_BF16=INTERPRETED and dtype == torch.bfloat16,
        num_warps=num_warps,
        num_stages=num_stages,
    )


def layout_meta(w: QuantizedTensor) -> LayoutMeta:
    """The weight's side of `quant_matmul_meta`'s arguments."""
    shared = w.sub_min is not None and w.sub_min is w.sub_scale
    return LayoutMeta(
        bits=w.bits,
        group_size=w.group_size,
        groups_per_super=w.super_group_size // w.group_size,
        has_sub_scale=w.sub_scale is not None,
        has_sub_min=w.sub_min is not None,
        shared_sub=shared,
    )


def supports(w: QuantizedTensor) -> bool:
    """Whether the kernel takes this layout (group sizes outside SUPPORTED_GROUP_SIZES don't)."""
    return w.group_size in SUPPORTED_GROUP_SIZES


def quantized_matmul_triton(x: torch.Tensor, w: QuantizedTensor) -> torch.Tensor:
    """x [M, K] @ W.T -> [M, N] in x's dtype, W dequantized inside the GEMM (float32 acc)."""
    n, k = w.shape
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be [M, {k}] for a [{n}, {k}] weight, got {tuple(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"x dtype {x.dtype} is not one of {SUPPORTED_DTYPES}")
    if not supports(w):
        raise ValueError(
            f"group size {w.group_size} is not one of {SUPPORTED_GROUP_SIZES} (Triton kernel)"
        )
    if x.device != w.device:
        raise ValueError(f"x is on {x.device}, the weight on {w.device}")
    m = x.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    x = last_dim_contiguous(x)
    codes, d, dmin = (last_dim_contiguous(t) for t in (w.codes, w.d, w.dmin))
    sub_scale = d if w.sub_scale is None else last_dim_contiguous(w.sub_scale)
    sub_min = d if w.sub_min is None else last_dim_contiguous(w.sub_min)
    meta = quant_matmul_meta(m, x.dtype, target_arch(), **layout_meta(w))
    grid = (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))
    _quant_matmul_kernel[grid](
        x,
        codes,
        d,
        dmin,
        sub_scale,
        sub_min,
        out,
        m,
        n,
        k,
        x.stride(0),
        codes.stride(0),
        d.stride(0),
        dmin.stride(0),
        sub_scale.stride(0),
        sub_min.stride(0),
        out.stride(0),
        **meta,
    )
    return out
