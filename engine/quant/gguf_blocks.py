"""GGUF quantized blocks -> `QuantizedTensor`, without going through float32.

Each decoder takes the raw bytes of whole rows ([rows, blocks_per_row * type_size] uint8, as a
GGUF file stores a matrix) and returns the parts of the packed format. The bit layouts follow
ggml (and `gguf.quants`, which the tests hold these decoders against, value for value).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from kvscope.kernels.quant_format import QuantizedTensor

Q = GGMLQuantizationType
QK_K = 256
SUPPORTED_QUANT_TYPES = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K)
DENSE_TYPES = (Q.F32, Q.F16, Q.BF16)
# A QuantizedTensor's fields by name, in numpy: "bits", "group_size" and "super_group_size" are
# ints, "codes", "d", "dmin" and "sub_scale" arrays, "sub_min" an array or None. A plain dict, not
# a TypedDict: the GGUF loader gathers chunks of them key by key.
Parts = dict[str, Any]


def _f16(raw: np.ndarray) -> np.ndarray:
    """[..., 2] uint8 -> [...] float16."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0]


def _halves_or_f32(values: np.ndarray) -> np.ndarray:
    """float16 if every value survives the round trip (so it is exact), else float32."""
    values = values.astype(np.float32)
    with np.errstate(over="ignore"):
        half = values.astype(np.float16)
    return half if np.array_equal(half.astype(np.float32), values) else values


def _nibbles_32(qs: np.ndarray) -> np.ndarray:
    """ggml's 32-element block: byte j holds element j (low) and j + 16 (high) -> [.., 32]."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _pack4(q: np.ndarray) -> np.ndarray:
    """[rows, K] codes 0..15 -> [rows, K / 2], element 2j low nibble, 2j + 1 high."""
    packed: np.ndarray = q[:, 0::2] | (q[:, 1::2] << 4)
    return packed.astype(np.uint8)


def _bits(qh: np.ndarray, count: int) -> np.ndarray:
    """Little-endian bit array: [..., count / 8] uint8 -> [..., count] uint8 of 0/1."""
    return np.unpackbits(qh, axis=-1, bitorder="little")[..., :count]


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of eight 6-bit scales and eight 6-bit mins -> two [.., 8]."""
    d, m, m_d = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def decode_blocks(raw: np.ndarray, qtype: Q, k: int) -> Parts:
    """Raw rows of a quantized GGUF tensor -> the parts of a QuantizedTensor (numpy)."""
    rows = raw.shape[0]
    block, type_size = GGML_QUANT_SIZES[qtype]
    b = raw.reshape(rows, k // block, type_size)
    if qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
        d = _f16(b[..., 0:2])
        if qtype == Q.Q8_0:
            q = (b[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
            return _one_level(8, q, d, -128 * d.astype(np.float32), rows, k)
        has_min = qtype in (Q.Q4_1, Q.Q5_1)
        m = _f16(b[..., 2:4]) if has_min else None
        start = 4 if has_min else 2
        if qtype in (Q.Q4_0, Q.Q4_1):
            q = _nibbles_32(b[..., start : start + 16])
            dmin = m if m is not None else -8 * d.astype(np.float32)
            return _one_level(4, q, d, dmin, rows, k)
        high = _bits(b[..., start : start + 4], 32)
        q = _nibbles_32(b[..., start + 4 : start + 20]) | (high << 4)
        dmin = m if m is not None else -16 * d.astype(np.float32)
        return _one_level(8, q, d, dmin, rows, k)
    if qtype in (Q.Q4_K, Q.Q5_K):
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        sc, mn = _k_scale_min(b[..., 4:16])
        if qtype == Q.Q4_K:
            qs = b[..., 16:144].reshape(rows, -1, 4, 32)  # 4 chunks of 32 bytes: 64 elements
            q = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(rows, -1)
            bits = 4
        else:
            qh = b[..., 16:48]  # bit j of byte i: element 32 j + i
            qs = b[..., 48:176].reshape(rows, -1, 4, 32)
            low = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(rows, -1, 8, 32)
            high = (qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1
            q = (low | (high.reshape(rows, -1, 8, 32) << 4)).reshape(rows, -1)
            bits = 8
        return _two_level(bits, 32, q, d, -dmin.astype(np.float32), sc, mn, rows, k)
    if qtype == Q.Q6_K:
        ql = b[..., 0:128].reshape(rows, -1, 2, 64)  # two halves of 128 elements
        qh = b[..., 128:192].reshape(rows, -1, 2, 32)
        scales = b[..., 192:208].view(np.int8)
        d = _f16(b[..., 208:210])
        low = np.stack([ql & 0x0F, ql >> 4], axis=3).reshape(rows, -1, 2, 4, 32)
        shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
        high = (qh[..., None, :] >> shifts) & 0x03  # [rows, blocks, 2, 4, 32]
        q = (low | (high << 4)).reshape(rows, -1)
        return _two_level(8, 16, q, d, -32 * d.astype(np.float32), scales, None, rows, k)
    raise ValueError(f"GGUF type {qtype.name} has no packed format")


def _one_level(
    bits: int, q: np.ndarray, d: np.ndarray, dmin: np.ndarray, rows: int, k: int
) -> Parts:
    q = q.reshape(rows, k)
    return {
        "bits": bits,
        "group_size": 32,
        "super_group_size": 32,
        "codes": _pack4(q) if bits == 4 else np.ascontiguousarray(q, dtype=np.uint8),
        "d": _halves_or_f32(d),
        "dmin": _halves_or_f32(dmin),
    }


def _two_level(
    bits: int,
    group: int,
    q: np.ndarray,
    d: np.ndarray,
    dmin: np.ndarray,
    sc: np.ndarray,
    mn: np.ndarray | None,
    rows: int,
    k: int,
) -> Parts:
    q = q.reshape(rows, k)
    parts: Parts = {
        "bits": bits,
        "group_size": group,
        "super_group_size": QK_K,
        "codes": _pack4(q) if bits == 4 else np.ascontiguousarray(q, dtype=np.uint8),
        "d": _halves_or_f32(d),
        "dmin": _halves_or_f32(dmin),
        "sub_scale": np.ascontiguousarray(sc.reshape(rows, -1)).astype(np.int8),
    }
    parts["sub_min"] = (
        None if mn is None else np.ascontiguousarray(mn.reshape(rows, -1)).astype(np.int8)
    )
    return parts


def to_quantized_tensor(parts: Parts, shape: tuple[int, int], kind: str) -> QuantizedTensor:
    """Parts (numpy, or concatenated chunks of them) -> a CPU QuantizedTensor."""
    d = torch.from_numpy(np.ascontiguousarray(parts["d"]))
    dmin = torch.from_numpy(np.ascontiguousarray(parts["dmin"]))
    if d.dtype != dmin.dtype:  # one of them needed float32: keep both alike for the kernels
        d, dmin = d.float(), dmin.float()
    sub_scale = parts.get("sub_scale")
    sub_scale = None if sub_scale is None else torch.from_numpy(sub_scale)
    sub_min = parts.get("sub_min")
    shared = sub_min is None and sub_scale is not None
    return QuantizedTensor(
        shape=shape,
        bits=parts["bits"],
        group_size=parts["group_size"],
        super_group_size=parts["super_group_size"],
        codes=torch.from_numpy(parts["codes"]),
        d=d,
        dmin=dmin,
        sub_scale=sub_scale,
        sub_min=sub_scale if shared else (None if sub_min is None else torch.from_numpy(sub_min)),
        kind=kind,
    )
