"""Long prefill chunks on a CPU with AMX: the quantized matrix dequantized to bfloat16 for one
GEMM (engine/quant/cpu_layout.gemv_matmul, kernels/cpu_gemv.dequantize_bf16) instead of the
int8 kernel. The dequantized bits against the float32 dequantization rounded to bfloat16, the
GEMM against the float64 reference, and the choice: only from BF16_GEMM_MIN_ROWS rows on, and
only where the CPU lists amx_bf16."""

import gguf
import numpy as np
import pytest
import torch
from tiny_models import QUANT_TYPES, random_quant_blocks

from kvscope.engine.quant import cpu_layout
from kvscope.engine.quant.cpu_gemv_layout import gemv_layout
from kvscope.engine.quant.gguf_blocks import decode_blocks, to_quantized_tensor
from kvscope.engine.quant.rtn import quantize_rtn
from kvscope.kernels import cpu_gemv

ns = cpu_gemv.load()
pytestmark = pytest.mark.skipif(ns is None, reason="numba's kernels do not compile here")
N, K = 1000, 512  # several chunks, the last one part padding


def _weight(kind: str):
    if kind in ("int4", "int8"):
        w = torch.randn(N, K, generator=torch.Generator().manual_seed(5)) * 0.05
        return quantize_rtn(w, 4 if kind == "int4" else 8)
    raw = random_quant_blocks(kind, N, K, seed=2)
    return to_quantized_tensor(decode_blocks(raw, gguf.GGMLQuantizationType[kind], K), (N, K), kind)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", [*QUANT_TYPES, "int4", "int8"])
def test_the_bfloat16_weights_are_the_dequantized_ones_rounded(kind, threads):
    g = gemv_layout(_weight(kind))
    assert g.codes.shape[0] > 1
    want = torch.from_numpy(cpu_gemv.dequantize_t(ns, g)).T.to(torch.bfloat16)
    bits = cpu_gemv.dequantize_bf16(ns, g, threads)
    got = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    assert got.shape == want.shape and torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q8_0", "Q4_0"])
def test_long_chunks_take_the_bfloat16_gemm_where_amx_is(kind, monkeypatch):
    monkeypatch.setattr(cpu_layout, "bf16_gemm_fast", lambda: True)
    calls = []
    dequantize = cpu_gemv.dequantize_bf16
    monkeypatch.setattr(cpu_gemv, "dequantize_bf16", lambda *a: calls.append(1) or dequantize(*a))
    w = _weight(kind)
    g = gemv_layout(w)
    ref_w = w.dequantize(torch.float64).T
    for rows, via_gemm in ((cpu_layout.BF16_GEMM_MIN_ROWS - 1, False), (300, True)):
        x = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows)).bfloat16()
        calls.clear()
        y = cpu_layout.gemv_matmul(g, x)
        assert bool(calls) == via_gemm
        assert y.dtype == torch.bfloat16 and y.shape == (rows, N)
        ref = x.double() @ ref_w
        assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2


def test_the_gemm_is_taken_only_where_the_cpu_lists_amx(tmp_path, monkeypatch):
    fast = cpu_layout.bf16_gemm_fast.__wrapped__  # uncached
    info = tmp_path / "cpuinfo"
    monkeypatch.setattr(cpu_layout, "CPUINFO", info)
    info.write_text("flags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n")
    assert fast() is False
    monkeypatch.setattr(cpu_layout, "CPUINFO", tmp_path / "missing")  # not Linux
    assert fast() is False
    info.write_text("flags\t\t: avx2 amx_bf16 amx_tile amx_int8\n")
    monkeypatch.setattr(cpu_layout, "CPUINFO", info)
    monkeypatch.setattr(torch._C._cpu, "_init_amx", lambda: False, raising=False)
    assert fast() is False  # listed, but the OS refused the tiles
    monkeypatch.setattr(torch._C._cpu, "_init_amx", lambda: True, raising=False)
    assert fast() is True
