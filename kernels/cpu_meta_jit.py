"""A quantized matrix's scales and offsets as jitted code reads them (kernels/cpu_gemv.py's
layout), one at a time: float16 bits widened, the offsets in each of their three forms, stored,
derived from a multiplier, or none, and the K-quants' super-blocks (`SuperScales`), whose scales
and offsets are computed from the file's own parts (the tile intrinsics' 16 at a time are in
kernels/cpu_meta_ir.py). Imported only through `cpu_gemv.load()`, as kernels/cpu_gemv_jit.py
is (whose doc says what the annotations are for)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeAlias, TypeVar

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from kvscope.kernels.cpu_meta import SUB_GROUPS, Offsets, Scales
from kvscope.kernels.cpu_meta_ir import (
    F32,
    I32,
    PINNED,
    TargetContext,
    plus_centre,
    super_product,
)
from kvscope.kernels.cpu_simd import CalledAs, Codegen

if TYPE_CHECKING:
    from numba.core.typing.context import BaseContext as TypingContext
    from numba.core.typing.templates import Signature


@CalledAs[Callable[[np.uint16 | np.float32], np.float32]]()
@intrinsic
def as_f32(typingctx: TypingContext, value: types.Type) -> tuple[Signature, Codegen] | None:
    """A scale or offset as float32: uint16 holds float16 bits (widened exactly: LLVM's fpext,
    one vcvtph2ps per 8 values on x86 with F16C), float32 passes through."""
    if value == types.uint16:

        def widen(
            context: TargetContext,
            builder: ir.IRBuilder,
            signature: Signature,
            args: Sequence[ir.Value],
        ) -> ir.Value:
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

        return types.float32(value), widen
    if value == types.float32:
        return types.float32(value), lambda context, builder, signature, args: args[0]
    return None


@CalledAs[Callable[[np.float32, np.float32], np.float32]]()
@intrinsic
def derived_low(
    typingctx: TypingContext, scale: types.Type, m: types.Type
) -> tuple[Signature, Codegen] | None:
    """m * scale in float32: an offset derived from its multiplier (kernels/cpu_gemv.py's `low`)
    for the dequantizers, bit for bit the stored offset it replaces. Its zero is +0, as a stored
    m + c scale's was (fast-math drops a + 0.0, not this integer select); and it is no float
    product to fast-math, which would turn scale * code + m * scale into scale * (code + m): -0,
    not +0, where the two cancel under a negative scale."""
    if scale != types.float32 or m != types.float32:
        return None

    def codegen(
        context: TargetContext, b: ir.IRBuilder, signature: Signature, args: Sequence[ir.Value]
    ) -> ir.Value:
        bits = b.bitcast(b.fmul(args[0], args[1], flags=PINNED), I32)
        negative_zero = b.icmp_unsigned("==", bits, ir.Constant(I32, 0x80000000))
        return b.bitcast(b.select(negative_zero, ir.Constant(I32, 0), bits), F32)

    return types.float32(scale, m), codegen


# The offsets' three forms, read alike by jitted code: numba's overloads, resolved by type when a
# kernel compiles. strict=False: numba would hold each typing function's annotations (numba
# types) against those of the function it returns (none).
Implementation: TypeAlias = Callable[..., object]  # compiled for the types its overload saw
Meta = TypeVar("Meta", bound=Scales | Offsets)  # a part of scales or offsets is of their form


def meta_part(meta: Meta, i: int) -> Meta:
    """meta[i] where the scales or offsets are an array, each array's [i] where they are a
    super-block tuple (`SuperScales`), and a multiplier or None (kernels/cpu_simd.py's `Offsets`)
    as it is: it holds for every part of the matrix. For jitted code (see `_meta_part`)."""
    raise NotImplementedError("jitted code only")


@overload(meta_part, inline="always", strict=False)
def _meta_part(meta: types.Type, i: types.Type) -> Implementation:
    if isinstance(meta, types.Array):
        return lambda meta, i: meta[i]
    if isinstance(meta, types.Tuple) and len(meta) == 2:  # sub-scales, d
        return lambda meta, i: (meta[0][i], meta[1][i])
    if isinstance(meta, types.Tuple):  # sub-mins, dmin, centre
        return lambda meta, i: (meta[0][i], meta[1][i], meta[2])
    return lambda meta, i: meta


def meta_flat(meta: Meta) -> Meta:
    """meta.reshape(-1) where the scales or offsets are an array, each array's where they are a
    super-block tuple, else meta as it is (see `meta_part`)."""
    raise NotImplementedError("jitted code only")


@overload(meta_flat, inline="always", strict=False)
def _meta_flat(meta: types.Type) -> Implementation:
    if isinstance(meta, types.Array):
        return lambda meta: meta.reshape(-1)
    if isinstance(meta, types.Tuple) and len(meta) == 2:
        return lambda meta: (meta[0].reshape(-1), meta[1].reshape(-1))
    if isinstance(meta, types.Tuple):
        return lambda meta: (meta[0].reshape(-1), meta[1].reshape(-1), meta[2])
    return lambda meta: meta


def scale_at(scale: Scales, t: int, g: int, n: int) -> np.float32:
    """Column n's scale in tile t, weight group g, as float32: scale[t, g, n] widened
    (`as_f32`), or a super-block's d times the group's sub-scale (`sub_product`)."""
    raise NotImplementedError("jitted code only")


@overload(scale_at, inline="always", strict=False)
def _scale_at(scale: types.Type, t: types.Type, g: types.Type, n: types.Type) -> Implementation:
    if isinstance(scale, types.Array):
        return lambda scale, t, g, n: as_f32(scale[t, g, n])
    return lambda scale, t, g, n: sub_product(scale[1][t, g // SUB_GROUPS, n], scale[0][t, g, n])


def low_at(low: Offsets, t: int, g: int, n: int, scale: np.float32) -> np.float32:
    """Column n's offset in tile t, weight group g, as float32, given its scale: low[t, g, n]
    widened (`as_f32`), the multiplier times the scale, or 0 (see `meta_part`), the dequantizers'
    weights then bit for bit those of stored offsets (`derived_low`); or a super-block's
    dmin times the group's sub-min plus the centre times the scale (`centred_min`)."""
    raise NotImplementedError("jitted code only")


@overload(low_at, inline="always", strict=False)
def _low_at(
    low: types.Type, t: types.Type, g: types.Type, n: types.Type, scale: types.Type
) -> Implementation:
    if isinstance(low, types.Array):
        return lambda low, t, g, n, scale: as_f32(low[t, g, n])
    if isinstance(low, types.Tuple):
        return lambda low, t, g, n, scale: centred_min(
            sub_product(low[1][t, g // SUB_GROUPS, n], low[0][t, g, n]), low[2], scale
        )
    if low == types.float32:
        return lambda low, t, g, n, scale: derived_low(scale, low)
    # derived_low's +0: fast-math would drop a constant + 0.0, leaving scale * code, -0 where the
    # code is 0 and the scale negative (a stored 0 made it +0)
    return lambda low, t, g, n, scale: derived_low(scale, np.float32(0.0))


@CalledAs[Callable[[np.uint16, np.uint8], np.float32]]()
@intrinsic
def sub_product(
    typingctx: TypingContext, half: types.Type, sub: types.Type
) -> tuple[Signature, Codegen] | None:
    """A super-block's d (or dmin), float16 bits, times a group's sub-scale (or sub-min), in
    float32 (see EXACT)."""
    if half != types.uint16 or sub != types.uint8:
        return None

    def codegen(
        context: TargetContext, b: ir.IRBuilder, signature: Signature, args: Sequence[ir.Value]
    ) -> ir.Value:
        return super_product(b, args[0], args[1])

    return types.float32(half, sub), codegen


@CalledAs[Callable[[np.float32, np.float32, np.float32], np.float32]]()
@intrinsic
def centred_min(
    typingctx: TypingContext, minimum: types.Type, centre: types.Type, scale: types.Type
) -> tuple[Signature, Codegen] | None:
    """A group's offset from its super-block parts: minimum + centre * scale (see EXACT)."""
    if (minimum, centre, scale) != (types.float32,) * 3:
        return None

    def codegen(
        context: TargetContext, b: ir.IRBuilder, signature: Signature, args: Sequence[ir.Value]
    ) -> ir.Value:
        return plus_centre(b, args[0], args[1], args[2])

    return types.float32(minimum, centre, scale), codegen
