"""A tile's scales and offsets as LLVM vectors, for kernels/cpu_simd.py's tile intrinsics (the
forms kernels/cpu_gemv.py's layout keeps them in), and the IR helpers both modules build with.
Imported only through `cpu_gemv.load()`, as kernels/cpu_gemv_jit.py is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from llvmlite import ir
from numba import types

from kvscope.kernels.cpu_meta import SUB_GROUPS

I1, I8, I16, I32, F32 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
LANES = 16  # scales and offsets of a tile: one per column


class _ArrayStruct(Protocol):
    data: ir.Value  # the pointer to the array's first element


class TargetContext(Protocol):
    """What the code generators use of numba's target context (numba.core.base.BaseContext,
    which is unannotated)."""

    def make_array(
        self, typ: types.Type
    ) -> Callable[[TargetContext, ir.IRBuilder, ir.Value], _ArrayStruct]: ...

    def get_dummy_value(self) -> ir.Value: ...


def vec(n: int, t: ir.Type) -> ir.VectorType:
    """<n x t>."""
    return ir.VectorType(t, n)


def array_data(
    context: TargetContext, b: ir.IRBuilder, aryty: types.Type, ary: ir.Value
) -> ir.Value:
    return context.make_array(aryty)(context, b, ary).data


def load(b: ir.IRBuilder, base: ir.Value, offset: int | ir.Value, t: ir.Type) -> ir.Value:
    """A `t` read at element `offset` of `base`, unaligned."""
    off = ir.Constant(I32, offset) if isinstance(offset, int) else offset
    return b.load(b.bitcast(b.gep(base, [off]), t.as_pointer()), align=1)


def broadcast(b: ir.IRBuilder, value: ir.Value, n: int) -> ir.Value:
    """<n x value>: one value in every lane."""
    one = b.insert_element(ir.Constant(vec(n, value.type), None), value, ir.Constant(I32, 0))
    return b.shuffle_vector(one, one, ir.Constant(vec(n, I32), [0] * n))


# The float arithmetic of a tile's sums, in a fixed order: y + d (scale sums), then + low s, each
# a multiply-add (llvm.fmuladd: one rounding where the CPU has FMA). numba's fastmath pass gives
# every float instruction without flags all of them, and LLVM then orders the sum as the IR
# around it suggests, so offsets derived as m * scale and the same offsets stored could round
# apart. "contract" alone keeps an instruction out of that pass and lets nothing reorder it. The
# order is the one LLVM chose for stored offsets (AVX-512 and AVX2), whose results stay as they
# were.
PINNED = ["contract"]


# The K-quants' super-blocks (kernels/cpu_simd.py's `SuperScales`). The layout once stored d * sc
# and dmin * m + c * s as float32, each product and sum rounded once by numpy; computed here,
# they are the same float32 operations, so every weight and result is the same bits. EXACT is a
# flag that changes nothing for a multiply or an add, but numba's fastmath pass adds its flags
# only to instructions that have none, and without "contract" LLVM fuses no multiply into the
# add: each rounds on its own.
EXACT = ["arcp"]


def super_product(b: ir.IRBuilder, half: ir.Value, sub: ir.Value) -> ir.Value:
    """float16 bits (i16 or <n x i16>) widened times unsigned bytes, in float32."""
    if isinstance(half.type, ir.VectorType):
        halfty, single = vec(half.type.count, ir.HalfType()), vec(half.type.count, F32)
    else:
        halfty, single = ir.HalfType(), F32
    wide = b.fpext(b.bitcast(half, halfty), single)
    return b.fmul(wide, b.uitofp(sub, single), flags=EXACT)


def plus_centre(b: ir.IRBuilder, minimum: ir.Value, centre: ir.Value, scale: ir.Value) -> ir.Value:
    """minimum + centre * scale, each rounded on its own (see EXACT)."""
    return b.fadd(minimum, b.fmul(centre, scale, flags=EXACT), flags=EXACT)


def _super_offset(b: ir.IRBuilder, offset: ir.Value) -> ir.Value:
    """A tile's group offset (16 (t K/G + g)) as its super-block's: 16 (t K/S + g // 8)."""
    per_block = ir.Constant(offset.type, LANES * SUB_GROUPS)
    return b.mul(b.udiv(offset, per_block), ir.Constant(offset.type, LANES))


def _meta16(b: ir.IRBuilder, aryty: types.Array, base: ir.Value, offset: ir.Value) -> ir.Value:
    """16 scales or offsets as float32: float16 bits (uint16) widened, or float32 as they are."""
    if aryty.dtype == types.uint16:
        bits = load(b, base, offset, vec(16, I16))
        return b.fpext(b.bitcast(bits, vec(16, ir.HalfType())), vec(16, F32))
    return load(b, base, offset, vec(16, F32))


def _super16(
    context: TargetContext,
    b: ir.IRBuilder,
    partsty: types.Tuple,
    parts: ir.Value,
    offset: ir.Value,
) -> ir.Value:
    """16 super-block products (d times sub-scales, or dmin times sub-mins) of one group."""
    subs = array_data(context, b, partsty.types[0], b.extract_value(parts, 0))
    halves = array_data(context, b, partsty.types[1], b.extract_value(parts, 1))
    sub = load(b, subs, offset, vec(16, I8))
    return super_product(b, load(b, halves, _super_offset(b, offset), vec(16, I16)), sub)


def scale16(
    context: TargetContext,
    b: ir.IRBuilder,
    scalety: types.Array | types.Tuple,
    scale: ir.Value,
    offset: ir.Value,
) -> ir.Value:
    """A tile's 16 scales of one group as float32 (kernels/cpu_simd.py's tile intrinsics), from
    flat `Scales` at element `offset`: an array's (`_meta16`) or a super-block's."""
    if isinstance(scalety, types.Tuple):
        return _super16(context, b, scalety, scale, offset)
    return _meta16(b, scalety, array_data(context, b, scalety, scale), offset)


def low16(
    context: TargetContext,
    b: ir.IRBuilder,
    lowty: types.Type,
    low: ir.Value,
    offset: ir.Value,
    scales: ir.Value,
) -> ir.Value | None:
    """A tile's 16 offsets as float32: loaded from an array (as `_meta16`), computed from a
    super-block's parts and the scales (as `low_at`), or a float32 multiplier times the scales
    (exact where the layout chose it: kernels/cpu_gemv.py), or None where the offsets are 0 (no
    term to add)."""
    if isinstance(lowty, types.Tuple):
        minimum = _super16(context, b, lowty, low, offset)
        return plus_centre(b, minimum, broadcast(b, b.extract_value(low, 2), 16), scales)
    if isinstance(lowty, types.Array):
        return _meta16(b, lowty, array_data(context, b, lowty, low), offset)
    if lowty == types.float32:
        return b.fmul(scales, broadcast(b, low, 16), flags=PINNED)
    return None
