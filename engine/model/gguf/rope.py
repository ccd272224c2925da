"""A GGUF file's rope scaling as HF's `rope_scaling` dict: from its metadata, or for Llama 3
from the `rope_freqs` tensor llama.cpp writes instead (fitted back to HF's llama3 parameters).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt


def gguf_rope_scaling(
    metadata: dict[str, Any],
    arch: str,
    rope_freqs: npt.NDArray[np.float32] | None,
    rope_theta: float,
    head_dim: int,
    path: Path,
) -> dict[str, Any] | None:
    """HF-style rope_scaling from the GGUF metadata, or from the llama3 `rope_freqs` tensor."""
    if rope_freqs is not None:
        return _llama3_from_rope_freqs(rope_freqs, rope_theta, head_dim, path)
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind not in ("linear", "yarn"):
        raise ValueError(f"{path}: rope scaling type {kind!r} is not supported")
    factor = metadata.get(f"{arch}.rope.scaling.factor")
    if factor is None:
        raise ValueError(f"{path}: GGUF metadata lacks {arch}.rope.scaling.factor")
    scaling: dict[str, Any] = {"rope_type": kind, "factor": float(factor)}
    original = metadata.get(f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    return scaling


def _llama3_from_rope_freqs(
    factors: npt.NDArray[np.float32], rope_theta: float, head_dim: int, path: Path
) -> dict[str, Any] | None:
    """Recover HF's llama3 rope_scaling from the per-frequency divisors llama.cpp stores.

    llama.cpp keeps 1 for high frequencies, `factor` for low ones, and 1/((1-s)/factor + s) in
    between, where s = (orig_ctx * inv_freq / 2pi - low) / (high - low) is linear in inv_freq.
    Every Llama 3 release uses low_freq_factor 1; with it, a line fit through the ramp gives
    high_freq_factor and original_max_position_embeddings. The result is checked by rebuilding
    the divisors, so a file with some other pattern fails loudly instead of running wrong.
    """
    factors = factors.astype(np.float64)
    factor = float(factors.max())
    if factor <= 1.0:
        return None
    inv_freq = rope_theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ramp = (factors > 1 + 1e-6) & (factors < factor - 1e-6)
    if factors.shape != inv_freq.shape or ramp.sum() < 2:
        raise ValueError(f"{path}: rope_freqs.weight does not follow the llama3 rope pattern")
    s = (1 / factors[ramp] - 1 / factor) / (1 - 1 / factor)
    slope, intercept = np.polyfit(inv_freq[ramp], s, 1)
    if intercept >= 0:  # the ramp must rise with frequency: intercept = -low / (high - low)
        raise ValueError(f"{path}: rope_freqs.weight does not follow the llama3 rope pattern")
    low = 1.0
    high = round(float(1 - 1 / intercept), 4)
    original = round(float(slope * 2 * math.pi * (high - low)))
    scaling = {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": original,
    }
    if not np.allclose(_llama3_rope_divisors(inv_freq, scaling), factors, rtol=1e-4):
        raise ValueError(f"{path}: rope_freqs.weight does not follow the llama3 rope pattern")
    return scaling


def _llama3_rope_divisors(
    inv_freq: npt.NDArray[np.float64], scaling: dict[str, Any]
) -> npt.NDArray[np.float64]:
    """What llama.cpp's converter stores in `rope_freqs` for a llama3 rope_scaling dict."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (original / wavelen - low) / (high - low)
    ramp = 1 / ((1 - smooth) / factor + smooth)
    return np.where(
        wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, ramp)
    )
