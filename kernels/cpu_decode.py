"""The fused CPU decode kernels (kernels/cpu_decode_jit.py), compiled with numba when installed.

`load()` returns them compiled (from numba's disk cache after the first time on a machine), or
None where numba is missing or fails, so callers keep torch's path. The warm-up calls each glue
kernel once on tiny arrays of exactly the dtypes and ranks the engine passes, so no step of a
chat stalls on a compile; the matmuls are warmed on a model's own weights
(engine/model/cpu_decode.py), whose layout they take.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from kvscope.kernels import cpu_gemv

logger = logging.getLogger(__name__)


@functools.cache
def load() -> SimpleNamespace | None:
    gemv = cpu_gemv.load()  # sets numba's cache dir, and compiles what these kernels call
    if gemv is None:
        return None
    try:
        from kvscope.kernels import cpu_decode_jit as jit
        from kvscope.kernels import numba_cache_guard

        numba_cache_guard.guard(jit, Path(os.environ["NUMBA_CACHE_DIR"]))  # as cpu_gemv's
        ns = SimpleNamespace(
            numba=gemv.numba,
            add_norm_quantize=jit.add_norm_quantize,
            norm_rows=jit.norm_rows,
            add_rows=jit.add_rows,
            silu_mul_quantize=jit.silu_mul_quantize,
            rope_store_attend=jit.rope_store_attend,
            rope_store_attend_parallel=jit.rope_store_attend_parallel,
            quantize_rows=gemv.quantize_rows,
            project={4: jit.project4, 8: jit.project8},
            project_parallel={4: jit.project4_parallel, 8: jit.project8_parallel},
        )
        if not cpu_gemv.cache_complete():  # else each loads on first use, as cpu_gemv's
            _warm_up(ns)
    except Exception as exc:  # any numba/LLVM failure: the engine keeps torch's decode
        logger.info("fused CPU decode kernels unavailable (%s); using torch's", exc)
        return None
    return ns


def _warm_up(ns: SimpleNamespace) -> None:
    m, hidden, d, hq, hkv, group = 2, 64, 8, 2, 1, 32
    f32 = functools.partial(np.zeros, dtype=np.float32)
    h, x = f32((m, hidden)), f32((m, hidden))
    xq = np.zeros((m, hidden), np.int8)
    xd, xs = f32((m, hidden // group)), f32((m, hidden // group))
    weight = np.ones(hidden, np.float32)
    ns.add_norm_quantize(h, h, weight, 1e-5, group, x, xq, xd, xs)
    ns.add_norm_quantize(h, h[:0], weight, 1e-5, group, x, xq, xd, xs)
    ns.norm_rows(h, weight, 1e-5, x)
    ns.add_rows(h, x)
    ns.silu_mul_quantize(f32((m, 2 * hidden)), x, group, xq, xd, xs)
    qkv = f32((m, (hq + 2 * hkv) * d))
    cache = np.zeros((2, 4, hkv, d), np.uint16)
    out = f32((m, hq * d))
    import torch  # only to read the engine's thread count; torch is imported already

    attends = [ns.rope_store_attend]
    if torch.get_num_threads() > 1:  # as cpu_gemv's warm-up: compiled where it will run
        attends.append(ns.rope_store_attend_parallel)
    for attend in attends:
        attend(
            qkv,
            f32(0),
            f32(0),
            f32(0),
            1e-5,
            f32((m, d)),
            f32((m, d)),
            cache,
            cache.copy(),
            np.zeros(m, np.int64),
            np.zeros((m, 2), np.int32),
            np.ones(m, np.int32),
            0,
            np.float32(0.5),  # the scale as engine/model/cpu_decode.py passes it
            hq,
            hkv,
            out,
            min(hq * d, group),
            np.zeros((m, hq * d), np.int8),
            f32((m, 1)),
            f32((m, 1)),
        )
