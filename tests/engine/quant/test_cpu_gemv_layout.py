"""numba's layout built from the packed format (engine/quant/cpu_gemv_layout.py): a symmetric
format keeps no offsets, and the kernels' m * scale gives every product bit for bit as offsets
stored as an array do, and the layout holds no more bytes than the file; the K-quants keep their
super-blocks, and the kernels' d * sc and dmin * m + c * scale give every product bit for bit
as the float32 scales and offsets they replace."""

import gguf
import numpy as np
import pytest
from tiny_models import random_quant_blocks

from kvscope.engine.quant import cpu_gemv_layout
from kvscope.engine.quant.cpu_gemv_layout import gemv_layout
from kvscope.engine.quant.gguf_blocks import decode_blocks, to_quantized_tensor
from kvscope.kernels import cpu_decode, cpu_gemv

ns = cpu_gemv.load()
fused = cpu_decode.load()  # the fused decode's matmul entries (engine/model/cpu_decode.py)
pytestmark = pytest.mark.skipif(fused is None, reason="numba is not installed or did not compile")

N_ROWS = 200  # 4 chunks of 64 columns, 56 of them padding
K_COLS = 512
Q4_0_BLOCK = 18  # bytes: float16 d, then 16 bytes of codes


def _layout(kind: str, raw: np.ndarray, n: int = N_ROWS, k: int = K_COLS):
    qtype = gguf.GGMLQuantizationType[kind]
    return gemv_layout(to_quantized_tensor(decode_blocks(raw, qtype, k), (n, k), kind))


def _stored(g: cpu_gemv.QuantizedCodesT) -> cpu_gemv.QuantizedCodesT:
    """g with its offsets as an array, as every layout kept them before symmetric formats
    dropped theirs: m * scale in float32 (0 for None; a zero +0), float16 bits where scales
    and offsets all are float16, else both float32."""
    if isinstance(g.low, np.ndarray):
        return g
    scale = g.scale.view(np.float16).astype(np.float32) if g.scale.dtype == np.uint16 else g.scale
    low = np.float32(0 if g.low is None else g.low) * scale + np.float32(0)  # +0, as m + c s
    with np.errstate(over="ignore"):  # -8 d past float16's range: float32 then
        half = scale.astype(np.float16), low.astype(np.float16)
    if np.array_equal(half[0], scale) and np.array_equal(half[1], low):
        scale, low = half[0].view(np.uint16), half[1].view(np.uint16)
    return cpu_gemv.QuantizedCodesT(g.codes, scale, low, g.group, g.bits, g.n)


def _same_results(
    g: cpu_gemv.QuantizedCodesT, rows: int, stored: cpu_gemv.QuantizedCodesT | None = None
) -> None:
    """Every kernel reading g gives exactly what it gives reading `stored` (`_stored(g)`)."""
    stored = _stored(g) if stored is None else stored
    x = np.random.default_rng(rows).standard_normal((rows, g.k)).astype(np.float32)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    for threads in (1, 2):
        y = cpu_gemv.matmul(ns, g, x, threads)
        assert np.array_equal(y, cpu_gemv.matmul(ns, stored, x, threads))
        y_bits = cpu_gemv.matmul_bf16(ns, g, bits, threads)
        assert np.array_equal(y_bits, cpu_gemv.matmul_bf16(ns, stored, bits, threads))
        w = cpu_gemv.dequantize_bf16(ns, g, threads)
        assert np.array_equal(w, cpu_gemv.dequantize_bf16(ns, stored, threads))
    xq, xd, xs = np.empty(x.shape, np.int8), *np.empty((2, rows, g.k // g.act_group), np.float32)
    ns.quantize_rows(x, g.act_group, xq, xd, xs)
    for project in (fused.project, fused.project_parallel):
        y, y_stored = np.zeros((2, rows, g.n), np.float32)
        project[g.bits](g.codes, g.scale, g.low, g.group, g.n, xq, xd, xs, y, 0)
        args = (stored.codes, stored.scale, stored.low, g.group, g.n, xq, xd, xs, y_stored, 0)
        project[g.bits](*args)
        assert np.array_equal(y, y_stored)
    # bits, zeros' signs included (kernels/cpu_meta_jit.derived_low)
    w32 = cpu_gemv.dequantize_t(ns, g).view(np.uint32)
    assert np.array_equal(w32, cpu_gemv.dequantize_t(ns, stored).view(np.uint32))


@pytest.mark.parametrize(
    ("kind", "offsets"),
    [
        ("Q4_0", np.float32(-8)),
        ("Q8_0", None),
        ("Q5_0", None),
        ("Q6_K", None),
        ("Q4_1", "array"),
    ],
)
@pytest.mark.parametrize("rows", [1, 4, 16, 64])
def test_derived_offsets_give_the_stored_ones_results(kind, offsets, rows):
    g = _layout(kind, random_quant_blocks(kind, N_ROWS, K_COLS, seed=rows))
    if offsets == "array":
        assert isinstance(g.low, np.ndarray)
    else:
        assert g.low == offsets and type(g.low) is type(offsets)
    _same_results(g, rows)


def test_q4_0_scales_stay_float16_where_minus_8_d_is_none():
    """|d| > 8188: -8 d overflows a float16, so stored offsets (and with them the scales) had
    to be float32; derived, the scales stay the file's float16."""
    raw = random_quant_blocks("Q4_0", N_ROWS, K_COLS, seed=5)
    blocks = raw.reshape(N_ROWS, -1, Q4_0_BLOCK)
    blocks[::3, 1, 0:2] = np.array([10000.0], np.float16).view(np.uint8)
    blocks[1::7, 3, 0:2] = np.array([-60000.0], np.float16).view(np.uint8)
    g = _layout("Q4_0", raw)
    assert g.scale.dtype == np.uint16 and g.low == np.float32(-8)
    assert _stored(g).scale.dtype == np.float32
    for rows in (1, 4, 16, 64):
        _same_results(g, rows)


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0"])
def test_symmetric_layouts_hold_the_files_bytes(kind):
    """Codes and a float16 scale per group, as the file: nothing more where no column is
    padding (256 columns: 4 chunks of 64)."""
    n = 256
    raw = random_quant_blocks(kind, n, K_COLS, seed=2)
    g = _layout(kind, raw, n=n)
    assert g.codes.shape[0] * g.width == n
    assert g.nbytes == raw.nbytes == cpu_gemv.layout_bytes(n, K_COLS, g.bits, 32, kind)


def test_an_all_zero_matrix_keeps_no_offsets():
    raw = np.zeros((N_ROWS, K_COLS // 32 * Q4_0_BLOCK), np.uint8)
    g = _layout("Q4_0", raw)
    assert g.low is None
    _same_results(g, 4)


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K"])
@pytest.mark.parametrize("rows", [1, 4, 16, 64])
def test_super_blocks_give_the_float32_scales_results(kind, rows, monkeypatch):
    raw = random_quant_blocks(kind, N_ROWS, K_COLS, seed=rows)
    g = _layout(kind, raw)
    assert isinstance(g.scale, tuple) and isinstance(g.low, tuple)
    with monkeypatch.context() as patched:  # the layout as it was: float32 per group
        patched.setattr(cpu_gemv_layout, "_keeps_super_blocks", lambda w: False)
        float32_scales = _layout(kind, raw)
    assert float32_scales.scale.dtype == np.float32 and isinstance(float32_scales.low, np.ndarray)
    _same_results(g, rows, float32_scales)


@pytest.mark.parametrize(("kind", "file_bytes"), [("Q4_K", 144), ("Q5_K", 176)])
def test_super_blocks_hold_about_the_files_bytes(kind, file_bytes):
    """Per 256 weights of a column: the codes, a byte sc and m per 32 and float16 d and dmin:
    Q4_K 148 bytes where the file holds 144 (5-bit Q5_K's codes widened to bytes: 276 to 176)."""
    n = 256
    raw = random_quant_blocks(kind, n, K_COLS, seed=3)
    assert raw.nbytes == n * K_COLS // 256 * file_bytes
    g = _layout(kind, raw, n=n)
    assert g.nbytes == cpu_gemv.layout_bytes(n, K_COLS, g.bits, 32, kind)
    codes = n * K_COLS * g.bits // 8
    assert g.nbytes == codes + n * K_COLS // 256 * (8 + 8 + 2 + 2)
    if kind == "Q4_K":
        assert g.nbytes * 144 == raw.nbytes * 148
