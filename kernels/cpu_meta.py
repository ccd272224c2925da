"""A matrix's scales and offsets in kernels/cpu_gemv.py's layout as Python handles them: their
forms, and the K-quants' super-blocks, which formats keep them and the tuples of arrays that
hold them (jitted code reads them through kernels/cpu_meta_jit.py and cpu_meta_ir.py). Plain
numpy: importing it compiles nothing."""

from __future__ import annotations

from typing import TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt

# A tile's scales and offsets: float32, or float16 bits (uint16) where every one is exactly a
# float16. The offsets of a symmetric format are no array (kernels/cpu_gemv.py's `low`): a
# float32 multiple m of the scale, or None for 0. The K-quants keep their file's parts instead:
# (uint8 sub-scales per group, float16 bits d per super-block) and (sub-mins, dmin, centre).
MetaArray: TypeAlias = npt.NDArray[np.float32] | npt.NDArray[np.uint16]
SuperScales: TypeAlias = tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint16]]
SuperOffsets: TypeAlias = tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint16], np.float32]
Scales: TypeAlias = MetaArray | SuperScales
Offsets: TypeAlias = MetaArray | SuperOffsets | np.float32 | None

Meta = TypeVar("Meta", bound=Scales | Offsets)  # a chunk's scales or offsets: the same form

# Formats whose layout keeps the file's super-blocks (kernels/cpu_gemv.py's module doc) where d
# and dmin are float16 and K a multiple of SUB_GROUPS groups; float32 scales and offsets else.
SUPER_KINDS = ("Q4_K", "Q5_K")
SUB_GROUPS = 8  # weight groups per super-block (the K-quants': 256 weights, groups of 32)


def super_examples(shape: tuple[int, ...]) -> tuple[SuperScales, SuperOffsets]:
    """Zero super-block scales and offsets for groups [C, Nc/16, K/G, 16] (kernels/cpu_gemv.py's
    warm-ups; a K short of a super-block takes a part of one)."""
    subs = np.zeros(shape, np.uint8)
    halves = np.zeros((*shape[:2], -(-shape[2] // SUB_GROUPS), shape[3]), np.uint16)
    return (subs, halves), (subs.copy(), halves.copy(), np.float32(0))


def check_super_blocks(scale: object, low: object, chunks: int, tiles: int) -> None:
    """Raises ValueError unless scale and low are super-block scales and offsets (see
    `super_parts_fit`) of a matrix of [chunks, tiles, ...] codes."""
    if not (isinstance(scale, tuple) and super_parts_fit(scale, chunks, tiles)):
        raise ValueError("super-block scales are (uint8 sub-scales, uint16 d) that fit the codes")
    if not (isinstance(low, tuple) and len(low) == 3 and super_parts_fit(low, chunks, tiles)):
        raise ValueError("super-block offsets are (uint8 sub-mins, uint16 dmin, float32 centre)")
    if low[0].shape != scale[0].shape:
        raise ValueError(f"sub-mins {low[0].shape} do not fit sub-scales {scale[0].shape}")


def super_parts_fit(parts: tuple[object, ...], chunks: int, tiles: int) -> bool:
    """Whether `parts` are super-block scales (sub-scales, d) or offsets (sub-mins, dmin,
    centre) of [chunks, tiles, ...] arrays, the sub-scales uint8 [.., K/G, 16] and the float16
    bits uint16 [.., K/S, 16]."""
    if len(parts) not in (2, 3) or (len(parts) == 3 and not isinstance(parts[2], np.float32)):
        return False
    subs, halves = parts[0], parts[1]
    if not isinstance(subs, np.ndarray) or not isinstance(halves, np.ndarray):
        return False
    if (subs.dtype, halves.dtype) != (np.uint8, np.uint16) or subs.ndim != 4 or halves.ndim != 4:
        return False
    return bool(
        subs.shape[:2] == halves.shape[:2] == (chunks, tiles)
        and subs.shape[3] == halves.shape[3] == 16
        and halves.shape[2] == -(-subs.shape[2] // SUB_GROUPS)
    )


def meta_bytes(meta: Scales | Offsets) -> int:
    """Bytes of a matrix's scales or offsets, in any of their forms."""
    if isinstance(meta, tuple):
        return sum(part.nbytes for part in meta if isinstance(part, np.ndarray))
    return meta.nbytes if isinstance(meta, np.ndarray) else 0


def meta_of(meta: Meta, chunk: int) -> Meta:
    """One chunk's scales or offsets: its part of each array; a multiplier, a centre or None
    hold for every chunk as they are."""
    if isinstance(meta, tuple):
        parts = tuple(part[chunk] if isinstance(part, np.ndarray) else part for part in meta)
        return parts  # type: ignore[return-value]  # (arrays, ...) as they were, one chunk's
    return meta[chunk] if isinstance(meta, np.ndarray) else meta
