"""The quantized-matmul Triton kernel, run in Triton's interpreter on CPU (conftest sets
TRITON_INTERPRET=1), against the torch reference `quantized_matmul_torch` and a float64 dense
product, for every layout `QuantizedTensor` allows and both tile configurations (decode-shaped
M <= 64, prefill-shaped M > 64).

Tolerances. Kernel and reference multiply the same W (dequantized in float32, rounded once to
x's dtype) by the same x with float32 accumulation; they differ in summation order and, for
16-bit x, in the final rounding of y. So:
  * against the reference: float32 1e-4 relative (summation order over K <= 512 terms moves
    ~1e-6 in practice); 16-bit one unit in the last place of y (rtol 2**-10 float16, 2**-7
    bfloat16) plus the same amount of max|y| absolute for sums that cancel.
  * against float64 x @ W.T, elementwise and rigorous: rounding W to x's dtype moves each
    product by at most u |x w| (u the unit roundoff: 2**-11 float16, 2**-8 bfloat16, 0 for
    float32), float32 summation at most K 2**-24 sum|x w|, rounding y at most u |y|:
        |y - y64| <= (2 u + K 2**-24) sum_k |x_k w_k| + u |y64| + 1e-6
"""

import pytest
import torch

from kvscope import kernels
from kvscope.kernels import triton_quant as tq
from kvscope.kernels.quant_format import QuantizedTensor, cat_rows, quantized_matmul_torch
from kvscope.kernels.triton_common import INTERPRETED

pytestmark = pytest.mark.skipif(
    not INTERPRETED, reason="needs TRITON_INTERPRET=1 before triton is imported"
)

UNIT_ROUNDOFF = {torch.float32: 0.0, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def _random_quantized(n, k, bits, group, super_group, d_dtype, sub, seed=0):
    """A QuantizedTensor [n, k] with random codes and scales. sub: "none", "both" (separate
    sub-scale and sub-min tensors) or "shared" (sub_min is sub_scale, Q6_K)."""
    gen = torch.Generator().manual_seed(seed)
    width = k // 2 if bits == 4 else k
    codes = torch.randint(0, 256, (n, width), dtype=torch.uint8, generator=gen)
    scale = 2.0**-6 if sub == "none" else 2.0**-12  # int8 sub-scales multiply by up to 128
    d = (torch.randn(n, k // super_group, generator=gen) * scale).to(d_dtype)
    dmin = (torch.randn(n, k // super_group, generator=gen) * scale).to(d_dtype)
    sub_scale = sub_min = None
    if sub != "none":
        shape = (n, k // group)
        sub_scale = torch.randint(-128, 128, shape, dtype=torch.int8, generator=gen)
        if sub == "shared":
            sub_min = sub_scale
        else:
            sub_min = torch.randint(-128, 128, shape, dtype=torch.int8, generator=gen)
    return QuantizedTensor(
        (n, k), bits, group, super_group, codes, d, dmin, sub_scale, sub_min, kind="test"
    )


def _check(x, w):
    """Kernel vs the torch reference and vs float64, with the tolerances of the module doc."""
    out = kernels.quantized_matmul(x, w, backend="triton")
    assert out.dtype == x.dtype and out.shape == (x.shape[0], w.shape[0])
    ref = quantized_matmul_torch(x, w)
    if x.dtype == torch.float32:
        rtol = 1e-4
    else:
        rtol = 2.0**-10 if x.dtype == torch.float16 else 2.0**-7
    torch.testing.assert_close(out, ref, rtol=rtol, atol=rtol * float(ref.abs().max()))

    w64 = w.dequantize(torch.float64)
    x64 = x.double()
    dense = x64 @ w64.t()
    magnitude = x64.abs() @ w64.abs().t()
    u = UNIT_ROUNDOFF[x.dtype]
    bound = (2 * u + w.shape[1] * 2.0**-24) * magnitude + u * dense.abs() + 1e-6
    err = (out.double() - dense).abs()
    assert bool((err <= bound).all()), f"max excess {float((err - bound).max())}"


# (bits, group, super-group, d dtype, sub-scales): the GGUF types and the engine's own RTN
# formats, plus the corners (group 64, 4-bit with shared sub-scales, float32 d with sub-scales).
LAYOUTS = {
    "Q4_0": (4, 32, 32, torch.float16, "none"),
    "Q4_K": (4, 32, 256, torch.float16, "both"),
    "Q5_K": (8, 32, 256, torch.float16, "both"),
    "Q6_K": (8, 16, 256, torch.float16, "shared"),
    "Q8_0": (8, 32, 32, torch.float16, "none"),
    "int4": (4, 128, 128, torch.float32, "none"),
    "int8": (8, 128, 128, torch.float32, "none"),
    "g64-f32-subs": (4, 64, 128, torch.float32, "both"),
    "g16-4bit-shared": (4, 16, 64, torch.float32, "shared"),
}


def _k_for(super_group):
    # 320 is not a multiple of 64 or 128: a partial last K tile (masked) in several configs.
    return 320 if 320 % super_group == 0 else 256 if super_group == 256 else 384


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("m", [1, 5, 64, 300])  # decode tiles for 1..64, prefill tiles for 300
def test_matches_reference_and_dense(layout, m):
    bits, group, super_group, d_dtype, sub = LAYOUTS[layout]
    k = _k_for(super_group)
    n = 80  # not a multiple of BLOCK_N: masked columns
    w = _random_quantized(n, k, bits, group, super_group, d_dtype, sub, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + 1))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        _check(x.to(dtype), w)


def test_both_configurations_are_used():
    """M <= 64 gets the decode tiles, larger M the prefill ones (per dtype, in the interpreter)."""
    layout = tq.layout_meta(_random_quantized(32, 256, 4, 32, 256, torch.float16, "both"))
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        decode = tq.quant_matmul_meta(64, dtype, None, **layout)
        prefill = tq.quant_matmul_meta(65, dtype, None, **layout)
        assert decode["BLOCK_M"] == 16 < prefill["BLOCK_M"]
    # Below sm_80 every dot is FMAs: the short-K tiles, as for float32 x.
    sm75 = tq.quant_matmul_meta(1, torch.float16, 75, **layout)
    assert sm75["BLOCK_K"] == tq.quant_matmul_meta(1, torch.float32, 90, **layout)["BLOCK_K"]


def test_strided_x_and_stacked_rows():
    """x a column slice of a wider activation (row stride > K); W stacked from two matrices by
    cat_rows (q/k/v-style); W a view into a larger weight."""
    k = 256
    parts = [_random_quantized(n, k, 4, 32, 256, torch.float16, "both", seed=n) for n in (48, 16)]
    wide = torch.randn(7, 3 * k)
    x = wide[:, k : 2 * k]
    assert x.stride(0) == 3 * k
    _check(x, cat_rows(parts))
    # Rows 16..80 and the first half of K of a bigger weight: every weight tensor is a view
    # whose row stride exceeds its width.
    big = _random_quantized(96, 2 * k, 8, 16, 256, torch.float16, "shared", seed=3)
    rows = slice(16, 80)
    sub = big.sub_scale[rows, : k // 16]
    d, dmin = big.d[rows, : k // 256], big.dmin[rows, : k // 256]
    view = QuantizedTensor((64, k), 8, 16, 256, big.codes[rows, :k], d, dmin, sub, sub)
    assert view.codes.stride(0) == 2 * k and sub.stride(0) == 2 * k // 16
    _check(torch.randn(3, k), view)


def test_int64_row_offsets():
    """Code rows 2**30 bytes apart: row 2 starts at 2**31, past int32 offsets. The 3 GiB of
    codes come from torch.empty; the OS backs only the pages the test writes."""
    k, stride = 256, 1 << 30
    storage = torch.empty((3, stride), dtype=torch.uint8)
    codes = storage[:, : k // 2]
    codes.copy_(torch.randint(0, 256, (3, k // 2), dtype=torch.uint8))
    d = torch.full((3, 1), 0.125, dtype=torch.float16)
    dmin = torch.full((3, 1), -1.0, dtype=torch.float16)
    w = QuantizedTensor((3, k), 4, 128, 256, codes, d, dmin)
    assert codes.stride(0) * 2 >= 2**31
    _check(torch.randn(2, k), w)


def test_dispatch_and_edges():
    w = _random_quantized(32, 256, 8, 32, 32, torch.float16, "none")
    x = torch.randn(3, 256)
    # "auto" on CPU tensors is the torch reference; "torch" too.
    assert torch.equal(kernels.quantized_matmul(x, w), quantized_matmul_torch(x, w))
    assert torch.equal(
        kernels.quantized_matmul(x, w, backend="torch"), quantized_matmul_torch(x, w)
    )
    empty = kernels.quantized_matmul(x[:0], w, backend="triton")
    assert empty.shape == (0, 32)
    with pytest.raises(ValueError, match="x must be"):
        kernels.quantized_matmul(torch.randn(3, 128), w, backend="triton")
    with pytest.raises(ValueError, match="dtype"):
        kernels.quantized_matmul(x.double(), w, backend="triton")
    odd = _random_quantized(32, 256, 8, 8, 32, torch.float16, "none")  # group 8: not taken
    with pytest.raises(ValueError, match="group size 8"):
        kernels.quantized_matmul(x, odd, backend="triton")
