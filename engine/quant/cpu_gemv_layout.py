"""Quantized weights in kernels/cpu_gemv.py's layout (K-major column chunks), built from the
packed format chunk by chunk, with no second copy of the matrix kept."""

from __future__ import annotations

import numpy as np

from kernels import cpu_gemv
from kernels.quant_format import QuantizedTensor


def gemv_layout(w: QuantizedTensor) -> cpu_gemv.QuantizedCodesT:
    """`w` transposed into column chunks; 8-bit codes centred (see kernels/cpu_gemv.py)."""
    # cpu_layout's numpy readers of the packed format; imported here, as cpu_layout imports us.
    from engine.quant.cpu_layout import _codes as codes_of
    from engine.quant.cpu_layout import _group_scales as group_scales_of

    n, k = w.shape
    g = w.group_size
    chunks, width = cpu_gemv.chunking(n)
    scale = np.zeros((chunks, k // g, width), np.float32)
    low = np.zeros_like(scale)
    if w.bits == 4:
        codes = np.zeros((chunks, k // 2, width), np.uint8)
        centre, run = 0, cpu_gemv.nibble_run()
    else:
        codes = np.zeros((chunks, k, width), np.int8)
        top = int(w.codes.max())
        centre = (top + 1) // 2  # codes become code - centre: |code| <= centre
        run = cpu_gemv.int8_run(max(centre, top - centre))  # >= 2: the kernel sums pairs
    for c in range(chunks):
        rows = slice(c * width, min(n, (c + 1) * width))
        count = rows.stop - rows.start
        if count <= 0:
            continue
        if w.bits == 4:
            codes[c, :, :count] = w.codes[rows].numpy().T  # byte j: elements 2j, 2j + 1
        else:
            shifted = codes_of(w, rows).astype(np.int16) - centre
            codes[c, :, :count] = shifted.astype(np.int8).T
        s, m = group_scales_of(w, rows)
        scale[c, :, :count] = s.T
        low[c, :, :count] = (m + centre * s).T
    return cpu_gemv.QuantizedCodesT(codes, scale, low, g, w.bits, run, n)
