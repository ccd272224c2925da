"""A quantized matrix's scales and offsets as jitted code reads them (kernels/cpu_gemv.py's
layout): float16 bits widened, and the offsets in each of their three forms, stored, derived
from a multiplier, or none. Imported only through `cpu_gemv.load()`, as kernels/cpu_gemv_jit.py
is (whose doc says what the annotations are for)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from kvscope.kernels.cpu_simd import F32, I32, PINNED, CalledAs, Codegen, Offsets, TargetContext

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


def low_part(low: Offsets, i: int) -> Offsets:
    """low[i] where the offsets are an array; a multiplier or None (kernels/cpu_simd.py's
    `Offsets`) holds for every part of the matrix as it is. For jitted code (see `_low_part`)."""
    raise NotImplementedError("jitted code only")


@overload(low_part, inline="always", strict=False)
def _low_part(low: types.Type, i: types.Type) -> Implementation:
    if isinstance(low, types.Array):
        return lambda low, i: low[i]
    return lambda low, i: low


def low_flat(low: Offsets) -> Offsets:
    """low.reshape(-1) where the offsets are an array, else low as it is (see `low_part`)."""
    raise NotImplementedError("jitted code only")


@overload(low_flat, inline="always", strict=False)
def _low_flat(low: types.Type) -> Implementation:
    if isinstance(low, types.Array):
        return lambda low: low.reshape(-1)
    return lambda low: low


def low_at(low: Offsets, t: int, g: int, n: int, scale: np.float32) -> np.float32:
    """Column n's offset in tile t, weight group g, as float32, given its scale: low[t, g, n]
    widened (`as_f32`), the multiplier times the scale, or 0 (see `low_part`), the dequantizers'
    weights then bit for bit those of stored offsets (`derived_low`)."""
    raise NotImplementedError("jitted code only")


@overload(low_at, inline="always", strict=False)
def _low_at(
    low: types.Type, t: types.Type, g: types.Type, n: types.Type, scale: types.Type
) -> Implementation:
    if isinstance(low, types.Array):
        return lambda low, t, g, n, scale: as_f32(low[t, g, n])
    if low == types.float32:
        return lambda low, t, g, n, scale: derived_low(scale, low)
    # derived_low's +0: fast-math would drop a constant + 0.0, leaving scale * code, -0 where the
    # code is 0 and the scale negative (a stored 0 made it +0)
    return lambda low, t, g, n, scale: derived_low(scale, np.float32(0.0))
