"""kernels/cpu_simd.py's tile intrinsics, one tile and activation group at a time: x86's
instructions and the portable IR (what a CPU without AVX2 runs) against integer arithmetic in
numpy, for 4-bit and 8-bit codes, one row and a block of rows, float32 and float16 scales."""

import numpy as np
import pytest

from kvscope.engine.quant.cpu_gemv_layout import _tiles4, _tiles8
from kvscope.kernels import cpu_gemv

pytestmark = pytest.mark.skipif(not cpu_gemv.installed(), reason="numba is not installed")
TILE = 16


def _runner(kernel):
    """A jitted call of one intrinsic over flat arrays (offsets 0, row strides as given)."""
    from numba import njit

    @njit
    def run(codes, xq, k, xd, xs, ng, scale, low, y, n):
        kernel(codes, 0, xq, 0, k, xd, xs, 0, ng, scale, low, 0, y, 0, n)

    return run


def _case(bits, a, rows, meta, seed):
    """Random codes for one 16-column tile of `a` elements, activations for `rows` rows, and
    the float64 expectation of y += scale * d * sum + low * s."""
    rng = np.random.default_rng(seed)
    if bits == 4:
        w = rng.integers(0, 16, (a, TILE), dtype=np.uint8)
        codes = _tiles4(w).reshape(-1)
    else:
        w = rng.integers(-128, 128, (a, TILE)).astype(np.int8)
        codes = _tiles8(w, a).reshape(-1)
    xq = rng.integers(-127, 128, (rows, a)).astype(np.int8)
    xd = rng.random(rows).astype(np.float32)
    xs = rng.standard_normal(rows).astype(np.float32)
    scale = rng.random(TILE).astype(np.float16)
    low = rng.standard_normal(TILE).astype(np.float16)
    y0 = rng.standard_normal((rows, TILE)).astype(np.float32)
    sums = xq.astype(np.int64) @ w.astype(np.int64)  # exact integers
    s64, l64 = scale.astype(np.float64), low.astype(np.float64)
    want = y0 + s64 * xd[:, None] * sums + l64 * xs[:, None]
    if meta == "half":
        scale_arg, low_arg = scale.view(np.uint16), low.view(np.uint16)
    else:
        scale_arg, low_arg = scale.astype(np.float32), low.astype(np.float32)
    args = (codes, xq.reshape(-1), a, xd, xs, 1, scale_arg, low_arg)
    return args, y0, want


@pytest.mark.parametrize("isa", ["chosen", "generic"])
@pytest.mark.parametrize("bits,a", [(4, 32), (8, 32), (8, 16)])
@pytest.mark.parametrize("meta", ["half", "float32"])
def test_a_tile_gives_the_integer_sums(isa, bits, a, meta):
    from kvscope.kernels import cpu_simd

    kernels = cpu_simd.tile_kernels(x86=cpu_simd.AVX2 if isa == "chosen" else False)
    name = "tile4" if bits == 4 else "tile8"
    suffix = "" if bits == 4 else f"_{a}"
    for rows, kind in ((cpu_simd.ROW_BLOCK, "block"), (1, "row")):
        args, y0, want = _case(bits, a, rows, meta, seed=bits * a + rows)
        y = y0.reshape(-1).copy()
        _runner(kernels[f"{name}_{kind}{suffix}"])(*args, y, TILE)
        np.testing.assert_allclose(y.reshape(rows, TILE), want, rtol=2e-6, atol=1e-3)


def test_the_largest_products_do_not_saturate():
    """The extremes the formats reach (4-bit 15, centred 8-bit -128, activations +-127) in
    every position: int16 pair sums and 16-element runs stay exact."""
    from kvscope.kernels import cpu_simd

    for bits, code in ((4, 15), (8, -128), (8, 127)):
        w = np.full((32, TILE), code, np.uint8 if bits == 4 else np.int8)
        codes = (_tiles4(w) if bits == 4 else _tiles8(w, 32)).reshape(-1)
        for x_value in (127, -127):
            xq = np.full(32, x_value, np.int8)
            one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
            scale, low = np.ones(TILE, np.float32), np.zeros(TILE, np.float32)
            y = np.zeros(TILE, np.float32)
            kernel = cpu_simd.tile4_row if bits == 4 else cpu_simd.tile8_row_32
            _runner(kernel)(codes, xq, 32, one, zero, 1, scale, low, y, TILE)
            assert np.all(y == 32 * code * x_value), (bits, code, x_value, y[:2])
