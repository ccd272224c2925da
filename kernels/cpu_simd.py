"""The integer inner loops of kernels/cpu_gemv_jit.py written as LLVM vector IR (numba
intrinsics): one tile of 16 output columns by one activation group, for 1 or 4 rows at a time.

Why not plain numba loops: LLVM vectorises those with int16 multiplies (vpmullw + vpaddw, 16
products per two instructions) and keeps the 32 activations of a group as scalars it spills; it
never finds x86's vpmaddubsw (32 products of an unsigned and a signed byte, summed in pairs, in
one instruction), which is how llama.cpp multiplies 4-bit codes with int8 activations. Spelled
out here, a 4-bit tile is 8 vector loads, 3 instructions each to split the nibbles, and per row
16 vpmaddubsw on broadcast activation pairs. Measured against the loops this replaced (the
bundled model, one thread): 3.5x at 40 rows, figures in kernels/cpu_gemv.py.

Where the CPU lacks AVX2, or numba is told to compile for another CPU, the same arithmetic is
written as portable vector IR (zero/sign-extend, multiply, add even and odd lanes), which LLVM
lowers for any target: the same integers, slower.

Layouts (per chunk of Nc columns; kernels/cpu_gemv.py builds them):

    4-bit   uint8 [Nc/16, K/32, 256]: tile t, group b, 8 vectors of 32 bytes. Byte 2n + e of
            vector j holds w[32b + 4j + e, 16t + n] in its low nibble and w[32b + 4j + 2 + e,
            16t + n] in its high one: the nibbles of a column sit in adjacent bytes, the pairs
            vpmaddubsw sums. Its 16 int16 sums are one per column, in order.
    8-bit   int8 [Nc/16, K/A, 16 A]: tile t, activation group b (A = 16 or 32 elements), A/4
            pairs of vectors: vector (j, h) holds columns 8h..8h+7, 4 bytes each (k = A b + 4j
            .. + 3). vpmaddubsw(|w|, sign(x, w)) sums two products in int16 (at most 2 * 128 *
            127 = 32512), vpmaddwd with ones the next two in int32: 8 columns per vector.

The sums never saturate: a 4-bit code times an int8 is at most 15 * 127, a pair 3810, and eight
pairs (16 elements) are summed in int16 (30480) before widening to int32.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Generic, TypeAlias, TypeVar, cast

import numpy as np
import numpy.typing as npt
from llvmlite import binding, ir
from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic

from kvscope.kernels.cpu_meta import Offsets, Scales
from kvscope.kernels.cpu_meta_ir import (
    F32,
    I8,
    I16,
    I32,
    PINNED,
    TargetContext,
    array_data,
    broadcast,
    load,
    low16,
    scale16,
    vec,
)

if TYPE_CHECKING:
    from numba.core.extending import _Intrinsic
    from numba.core.typing.context import BaseContext as TypingContext
    from numba.core.typing.templates import Signature

ISA_ENV = "KVSCOPE_CPU_SIMD"  # "generic" forces the portable IR (tests compare both)

# The arrays the kernels take: 4-bit codes (uint8) or centred 8-bit ones (int8); activations
# rounded to int8 with their float32 scales and sums; a tile's scales and offsets in their forms
# (kernels/cpu_meta.py).
CodeArray: TypeAlias = npt.NDArray[np.uint8] | npt.NDArray[np.int8]
Int8Array: TypeAlias = npt.NDArray[np.int8]
Float32Array: TypeAlias = npt.NDArray[np.float32]

# A tile intrinsic as jitted code calls it (see `_tile_kernel`); offsets count elements.
TileKernel: TypeAlias = Callable[
    [
        CodeArray,  # codes
        int,  # their offset
        Int8Array,  # xq
        int,  # its offset
        int,  # its row stride
        Float32Array,  # xd
        Float32Array,  # xs
        int,  # their offset
        int,  # their row stride
        Scales,  # scale
        Offsets,  # low
        int,  # their offset
        Float32Array,  # y
        int,  # its offset
        int,  # its row stride
    ],
    None,
]


# An intrinsic's code generator: its typing function gives numba the call's signature and this.
Codegen: TypeAlias = (
    "Callable[[TargetContext, ir.IRBuilder, Signature, Sequence[ir.Value]], ir.Value]"
)
# The integer sums of one tile and activation group, row by row: body(b, codes, xrows).
TileBody: TypeAlias = Callable[[ir.IRBuilder, ir.Value, list[ir.Value]], list[ir.Value]]

_C = TypeVar("_C")


class CalledAs(Generic[_C]):
    """`@CalledAs[C]()` over `@intrinsic`: the intrinsic, typed C, as jitted code calls it.
    numba's stubs type that call with the typing function's parameters, the typing context
    first, which jitted code never passes, and no result (from Python, the call raises)."""

    def __call__(self, fn: _Intrinsic[Callable[..., object]]) -> _C:
        return cast(_C, fn)


def isa() -> str:
    """ "avx2" where numba compiles for this CPU and it has AVX2, else "generic"."""
    if os.environ.get(ISA_ENV) == "generic":
        return "generic"
    # Cross-compiling for another CPU. (config's reloader sets CPU_NAME, from NUMBA_CPU_NAME,
    # through globals(): mypy does not see it.)
    if config.CPU_NAME not in (None, "host"):  # type: ignore[attr-defined]
        return "generic"
    try:
        features = binding.get_host_cpu_features()
    except RuntimeError:  # no feature list on this host
        return "generic"
    return "avx2" if features.get("avx2") else "generic"


AVX2 = isa() == "avx2"


def _splat(t: ir.Type, n: int, value: int) -> ir.Constant:
    return ir.Constant(vec(n, t), [value] * n)


def _lanes(n: int, start: int = 0, step: int = 1) -> ir.Constant:
    return ir.Constant(vec(n, I32), list(range(start, start + n * step, step)))


# numba's (unannotated): the declaration of LLVM function `name` in a module, added once
_get_or_insert_function: Callable[[ir.Module, ir.FunctionType, str], ir.Function] = (
    cgutils.get_or_insert_function
)


def _call(b: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
    signature = ir.FunctionType(ret, [a.type for a in args])
    return b.call(_get_or_insert_function(b.module, signature, name), args)


def _maddubs(b: ir.IRBuilder, u: ir.Value, s: ir.Value, x86: bool) -> ir.Value:
    """u (unsigned) x s (signed) bytes, adjacent products summed: <16 x i16>."""
    if x86:
        return _call(b, "llvm.x86.avx2.pmadd.ub.sw", vec(16, I16), [u, s])
    p = b.mul(b.zext(u, vec(32, I16)), b.sext(s, vec(32, I16)))  # our sums never saturate
    return b.add(b.shuffle_vector(p, p, _lanes(16, 0, 2)), b.shuffle_vector(p, p, _lanes(16, 1, 2)))


def _madd_ones(b: ir.IRBuilder, p: ir.Value, x86: bool) -> ir.Value:
    """<16 x i16> -> <8 x i32>, adjacent lanes summed."""
    if x86:
        return _call(b, "llvm.x86.avx2.pmadd.wd", vec(8, I32), [p, _splat(I16, 16, 1)])
    even = b.sext(b.shuffle_vector(p, p, _lanes(8, 0, 2)), vec(8, I32))
    return b.add(even, b.sext(b.shuffle_vector(p, p, _lanes(8, 1, 2)), vec(8, I32)))


def _sign(b: ir.IRBuilder, x: ir.Value, w: ir.Value, x86: bool) -> ir.Value:
    """x where w > 0, -x where w < 0, 0 where w == 0 (bytes)."""
    if x86:
        return _call(b, "llvm.x86.avx2.psign.b", vec(32, I8), [x, w])
    zero = _splat(I8, 32, 0)
    signed = b.select(b.icmp_signed("<", w, zero), b.sub(zero, x), x)
    return b.select(b.icmp_signed("==", w, zero), zero, signed)


def _abs(b: ir.IRBuilder, w: ir.Value) -> ir.Value:
    zero = _splat(I8, 32, 0)
    return b.select(b.icmp_signed("<", w, zero), b.sub(zero, w), w)  # -128 stays 0x80: 128


def _fmuladd(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
    """x * y + z, <16 x float> (see PINNED)."""
    return _call(b, "llvm.fmuladd.v16f32", x.type, [x, y, z])


def _tile_kernel(rows: int, body: TileBody) -> TileKernel:
    """An intrinsic y[r, 16 columns] += scale * d_r * sums_r + low * s_r for `rows` rows, where
    body(b, codes, xrows) gives each row's 16 int32 sums of one tile and activation group.

    Arguments (flat 1-D arrays and element offsets): codes, code offset, xq, xq offset, xq row
    stride, xd, xs, their offset, their row stride, scale, low, their offset, y, y offset, y
    row stride. `low` is an array as `scale` is, or a float32 m for offsets m * scale, or None
    for offsets of 0 (the term is then left out); or both are super-block tuples (their 16
    float32 values of a group: kernels/cpu_meta_ir.py)."""

    @CalledAs[TileKernel]()
    @intrinsic
    def tile(
        typingctx: TypingContext,
        codes: types.Type,
        co: types.Type,
        xq: types.Type,
        xo: types.Type,
        xstep: types.Type,
        xd: types.Type,
        xs: types.Type,
        do: types.Type,
        dstep: types.Type,
        scale: types.Type,
        low: types.Type,
        wo: types.Type,
        y: types.Type,
        yo: types.Type,
        ystep: types.Type,
    ) -> tuple[Signature, Codegen] | None:
        if not isinstance(low, types.Array | types.Tuple | types.NoneType) and (
            low != types.float32
        ):
            return None  # numba says no implementation takes these arguments
        sig = types.void(codes, co, xq, xo, xstep, xd, xs, do, dstep, scale, low, wo, y, yo, ystep)

        def codegen(
            context: TargetContext, b: ir.IRBuilder, signature: Signature, args: Sequence[ir.Value]
        ) -> ir.Value:
            at = signature.args
            code_base = b.gep(array_data(context, b, at[0], args[0]), [args[1]])
            x_base = b.gep(array_data(context, b, at[2], args[2]), [args[3]])
            xstep_v, dstep_v, ystep_v = args[4], args[8], args[14]
            xrows = [
                b.gep(x_base, [b.mul(xstep_v, ir.Constant(xstep_v.type, r))]) for r in range(rows)
            ]
            sums = body(b, code_base, xrows)
            d_base = b.gep(array_data(context, b, at[5], args[5]), [args[7]])
            s_base = b.gep(array_data(context, b, at[6], args[6]), [args[7]])
            scales = scale16(context, b, at[9], args[9], args[11])
            offsets = low16(context, b, at[10], args[10], args[11], scales)
            y_base = b.gep(array_data(context, b, at[12], args[12]), [args[13]])
            for r in range(rows):
                at_r = b.mul(dstep_v, ir.Constant(dstep_v.type, r))
                d = broadcast(b, b.load(b.gep(d_base, [at_r])), 16)
                total = b.sitofp(sums[r], vec(16, F32))
                y_at = b.mul(ystep_v, ir.Constant(ystep_v.type, r))
                ptr = b.bitcast(b.gep(y_base, [y_at]), vec(16, F32).as_pointer())
                acc = _fmuladd(b, d, b.fmul(total, scales, flags=PINNED), b.load(ptr, align=4))
                if offsets is not None:
                    s = broadcast(b, b.load(b.gep(s_base, [at_r])), 16)
                    acc = _fmuladd(b, offsets, s, acc)
                b.store(acc, ptr, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return tile


def _sums4(rows: int, x86: bool) -> TileBody:
    def body(b: ir.IRBuilder, codes: ir.Value, xrows: list[ir.Value]) -> list[ir.Value]:
        nibble, four = _splat(I8, 32, 15), _splat(I8, 32, 4)
        # int16 sums of 16 elements each
        halves: list[list[ir.Value | None]] = [[None, None] for _ in range(rows)]
        for j in range(8):
            v = load(b, codes, 32 * j, vec(32, I8))
            lo, hi = b.and_(v, nibble), b.and_(b.lshr(v, four), nibble)
            for r in range(rows):
                pair_a = broadcast(b, load(b, xrows[r], 4 * j, I16), 16)
                pair_b = broadcast(b, load(b, xrows[r], 4 * j + 2, I16), 16)
                p = b.add(
                    _maddubs(b, lo, b.bitcast(pair_a, vec(32, I8)), x86),
                    _maddubs(b, hi, b.bitcast(pair_b, vec(32, I8)), x86),
                )
                h = halves[r][j // 4]
                halves[r][j // 4] = p if h is None else b.add(h, p)
        wide = vec(16, I32)
        return [b.add(b.sext(lo, wide), b.sext(hi, wide)) for lo, hi in halves]

    return body


def _sums8(rows: int, act_group: int, x86: bool) -> TileBody:
    def body(b: ir.IRBuilder, codes: ir.Value, xrows: list[ir.Value]) -> list[ir.Value]:
        # int32 sums of columns 0-7 and 8-15
        halves: list[list[ir.Value | None]] = [[None, None] for _ in range(rows)]
        for j in range(act_group // 4):
            quads = [broadcast(b, load(b, xrows[r], 4 * j, I32), 8) for r in range(rows)]
            for h in range(2):
                w = load(b, codes, 32 * (2 * j + h), vec(32, I8))
                magnitude = _abs(b, w)
                for r in range(rows):
                    x = _sign(b, b.bitcast(quads[r], vec(32, I8)), w, x86)
                    p = _madd_ones(b, _maddubs(b, magnitude, x, x86), x86)
                    halves[r][h] = p if halves[r][h] is None else b.add(halves[r][h], p)
        return [b.shuffle_vector(lo, hi, _lanes(16)) for lo, hi in halves]

    return body


def tile_kernels(x86: bool) -> dict[str, TileKernel]:
    """The six intrinsics, in x86's instructions or the portable IR (tests hold one to the
    other): 4-bit and 8-bit (activation groups of 32 and 16), for ROW_BLOCK rows or one."""
    kernels = {"tile4_block": _tile_kernel(ROW_BLOCK, _sums4(ROW_BLOCK, x86))}
    kernels["tile4_row"] = _tile_kernel(1, _sums4(1, x86))
    for a in (32, 16):
        kernels[f"tile8_block_{a}"] = _tile_kernel(ROW_BLOCK, _sums8(ROW_BLOCK, a, x86))
        kernels[f"tile8_row_{a}"] = _tile_kernel(1, _sums8(1, a, x86))
    return kernels


ROW_BLOCK = 4  # rows per call where a batch has them: a tile's codes are split once for 4 rows
_chosen = tile_kernels(AVX2)
tile4_block, tile4_row = _chosen["tile4_block"], _chosen["tile4_row"]
tile8_block_32, tile8_row_32 = _chosen["tile8_block_32"], _chosen["tile8_row_32"]
tile8_block_16, tile8_row_16 = _chosen["tile8_block_16"], _chosen["tile8_row_16"]


@CalledAs[Callable[[npt.NDArray[np.generic] | Scales | Offsets, int], None]]()
@intrinsic
def prefetch(
    typingctx: TypingContext, ary: types.Type, index: types.Type
) -> tuple[Signature, Codegen]:
    """Ask for element `index` of `ary`'s buffer to be brought into cache (a hint: no fault,
    no result). For reads the hardware prefetcher does not see coming: paged K/V, block by
    block. Offsets that are no array (a multiplier or None: `Offsets`) have nothing to fetch; a
    super-block tuple's first array (the sub-scales or sub-mins) is fetched."""
    sig = types.void(ary, index)

    def codegen(
        context: TargetContext, b: ir.IRBuilder, signature: Signature, args: Sequence[ir.Value]
    ) -> ir.Value:
        aryty, value = signature.args[0], args[0]
        if isinstance(aryty, types.Tuple):
            aryty, value = aryty.types[0], b.extract_value(value, 0)
        if not isinstance(aryty, types.Array):
            return context.get_dummy_value()
        pointer = b.gep(array_data(context, b, aryty, value), [args[1]])
        i8p = b.bitcast(pointer, I8.as_pointer())
        # read, keep in all cache levels, data cache
        hint = [ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)]
        _call(b, "llvm.prefetch.p0i8", ir.VoidType(), [i8p, *hint])
        return context.get_dummy_value()

    return sig, codegen
