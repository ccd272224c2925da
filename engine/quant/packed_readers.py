"""The packed format's codes and per-group scales as numpy arrays, a slice of rows at a time.

Both CPU layouts are built from these (engine.quant.cpu_layout: torch's int4 and the dense
fallback; engine.quant.cpu_gemv_layout: numba's), so they sit below both.
"""

from __future__ import annotations

import numpy as np

from kvscope.kernels.quant_format import QuantizedTensor


def codes_of(w: QuantizedTensor, rows: slice) -> np.ndarray:
    """uint8 [rows, K], one code per element (numpy: several times faster than torch's uint8
    ops on the CPU for this shuffling; load time is mostly this)."""
    c = w.codes[rows].numpy()
    if w.bits == 8:
        return c
    q = np.empty((c.shape[0], c.shape[1] * 2), dtype=np.uint8)
    q[:, 0::2], q[:, 1::2] = c & 0x0F, c >> 4
    return q


def group_scales_of(w: QuantizedTensor, rows: slice) -> tuple[np.ndarray, np.ndarray]:
    """float32 (scale, min) per group [rows, K / g]: the super-group's d and dmin, times the
    group's sub-scales where the format has them."""
    per_super = w.super_group_size // w.group_size
    scale = np.repeat(w.d[rows].float().numpy(), per_super, axis=1)
    low = np.repeat(w.dmin[rows].float().numpy(), per_super, axis=1)
    if w.sub_scale is not None:
        scale = scale * w.sub_scale[rows].numpy()
    if w.sub_min is not None:
        low = low * w.sub_min[rows].numpy()
    return scale.astype(np.float32), low.astype(np.float32)
