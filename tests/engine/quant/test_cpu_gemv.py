"""numba's CPU quantized matmul (kernels/cpu_gemv.py): the kernel against a dequantized float
reference for every format, the engine's greedy tokens against HF float32, and the fallback to
torch's kernels where numba is missing."""

import os
import shutil
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch
from tiny_models import QUANT_TYPES, random_quant_blocks

from kvscope.engine import LLM, SamplingParams
from kvscope.engine.cpu_kernels import compile_all, kernels_compiled, numba_dir
from kvscope.engine.quant import cpu_layout as layout_module
from kvscope.engine.quant.cpu_gemv_layout import gemv_layout
from kvscope.engine.quant.gguf_blocks import decode_blocks, to_quantized_tensor
from kvscope.engine.quant.rtn import quantize_rtn
from kvscope.kernels import cpu_gemv

ns = cpu_gemv.load()
# numba is a dependency: where it is installed, a kernel that does not compile is a failure
# (load() would otherwise hand the engine back to torch's kernels without a word).
pytestmark = pytest.mark.skipif(not cpu_gemv.installed(), reason="numba is not installed")


def test_the_kernels_compile():
    assert ns is not None, "numba is installed but kernels/cpu_gemv.py did not compile"


N_ROWS = 200  # not a multiple of a chunk's width: 4 chunks of 64 columns, 56 of them padding
K_COLS = 512  # two Q4_K super-blocks, 16 groups of 32 (32 of Q6_K's 16)


def _weight(kind: str, n: int = N_ROWS, k: int = K_COLS):
    if kind in ("int4", "int8"):
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(3)) * 0.05
        return quantize_rtn(w, 4 if kind == "int4" else 8)
    raw = random_quant_blocks(kind, n, k, seed=1)
    return to_quantized_tensor(decode_blocks(raw, gguf.GGMLQuantizationType[kind], k), (n, k), kind)


def _close(y: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    # int8 activations round each group to 1/254 of its largest value: a ~0.3% error per
    # element that sums to well under 1% of the output's size.
    rel = ((y - ref).norm() / ref.norm()).item()
    assert rel < tol, f"relative error {rel:.2e} over {tol:.0e}"


@pytest.mark.parametrize("kind", [*QUANT_TYPES, "int4", "int8"])
def test_layout_holds_the_weight(kind):
    w = _weight(kind)
    g = gemv_layout(w)
    assert g.n == N_ROWS and g.codes.shape[0] * g.width >= N_ROWS
    dense = torch.from_numpy(cpu_gemv.dequantize_t(ns, g)[:, :N_ROWS]).T
    assert torch.allclose(dense, w.dequantize(torch.float32), rtol=1e-5, atol=1e-7)
    assert g.nbytes == cpu_gemv.layout_bytes(*w.shape, w.bits, w.group_size, w.kind)


@pytest.mark.parametrize("kind", [*QUANT_TYPES, "int4", "int8"])
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_kernel_matches_dequantized_reference(kind, rows):
    w = _weight(kind)
    g = gemv_layout(w)
    x = torch.randn(rows, K_COLS, generator=torch.Generator().manual_seed(rows)).bfloat16()
    ref = x.double() @ w.dequantize(torch.float64).T
    y = layout_module.gemv_matmul(g, x)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, N_ROWS)
    _close(y.double(), ref, 1e-2)
    y32 = cpu_gemv.columns(cpu_gemv.matmul(ns, g, x.float().numpy(), threads=1), N_ROWS)
    _close(torch.from_numpy(np.ascontiguousarray(y32)).double(), ref, 1e-2)


@pytest.mark.parametrize("kind", [*QUANT_TYPES, "int4", "int8"])
def test_scales_are_float16_only_where_that_is_exact(kind):
    g = gemv_layout(_weight(kind))
    if (
        kind in cpu_gemv.SUPER_KINDS
    ):  # the file's parts (tests/engine/quant/test_cpu_gemv_layout.py)
        (sc, d), (m, dmin, _) = g.scale, g.low
        assert (sc.dtype, d.dtype, m.dtype, dmin.dtype) == (np.uint8, np.uint16) * 2
        assert g.width == sc.shape[1] * cpu_gemv.TILE == g.codes.shape[1] * cpu_gemv.TILE
        return
    half = kind in cpu_gemv.HALF_KINDS
    assert g.scale.dtype == (np.uint16 if half else np.float32)
    # a symmetric format's offsets are no array (tests/engine/quant/test_cpu_gemv_layout.py)
    stored = kind not in cpu_gemv.SYMMETRIC_KINDS
    assert isinstance(g.low, np.ndarray) == stored
    assert not stored or g.low.dtype == g.scale.dtype
    assert g.width == g.scale.shape[1] * cpu_gemv.TILE == g.codes.shape[1] * cpu_gemv.TILE


@pytest.mark.parametrize("kind", ["Q8_0", "Q6_K", "Q4_1"])
def test_wide_matrices_and_row_blocks(kind):
    """A head-shaped matrix (chunks of 1,000+ columns, 16 elements per Q6_K group) at batch
    sizes that use the 4-row blocks, a remainder, and both: against the float reference."""
    n, k = 4 * 1024 + 40, 256
    w = _weight(kind, n=n, k=k)
    g = gemv_layout(w)
    assert g.width >= 1024
    for rows in (4, 7):
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).bfloat16()
        ref = x.double() @ w.dequantize(torch.float64).T
        _close(layout_module.gemv_matmul(g, x).double(), ref, 1e-2)
    dense = torch.from_numpy(cpu_gemv.dequantize_t(ns, g)[:, :n]).T
    assert torch.allclose(dense, w.dequantize(torch.float32), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_threads_split_columns_into_the_same_sums(kind):
    g = gemv_layout(_weight(kind))
    x = np.random.default_rng(0).standard_normal((4, K_COLS)).astype(np.float32)
    one = cpu_gemv.matmul(ns, g, x, threads=1)
    assert np.array_equal(cpu_gemv.matmul(ns, g, x, threads=2), one)


def test_prefill_chunks_run_the_integer_kernel(monkeypatch):
    """Hundreds of rows (a prefill chunk) through the same kernel, in 4-row blocks and two
    passes over the tiles (256 rows of K = 512 each, then the rest), where no AMX is there to
    take them (tests/engine/quant/test_cpu_prefill_gemm.py)."""
    monkeypatch.setattr(layout_module, "bf16_gemm_fast", lambda: False)
    w = _weight("Q4_K")
    x = torch.randn(301, K_COLS, generator=torch.Generator().manual_seed(9)).bfloat16()
    ref = x.double() @ w.dequantize(torch.float64).T
    _close(layout_module.gemv_matmul(gemv_layout(w), x).double(), ref, 1e-2)


def test_wrong_activation_width_is_refused_by_shape():
    g = gemv_layout(_weight("Q4_0"))
    with pytest.raises(ValueError, match=r"\[M, 512\]"):
        cpu_gemv.matmul(ns, g, np.zeros((1, 256), np.float32), threads=1)


def test_without_numba_torch_kernels_run(monkeypatch):
    monkeypatch.setitem(sys.modules, "numba", None)  # `import numba` raises ImportError
    cpu_gemv.load.cache_clear()
    try:
        assert not cpu_gemv.installed() and cpu_gemv.load() is None
        w = _weight("Q4_K")
        linear = layout_module.cpu_layout(w)
        assert linear.gemv is None
        x = torch.randn(2, K_COLS).bfloat16()
        _close(linear(x).double(), x.double() @ w.dequantize(torch.float64).T, 1e-2)
    finally:
        monkeypatch.undo()
        cpu_gemv.load.cache_clear()
    assert cpu_gemv.load() is not None


@pytest.mark.slow  # HF's float32 load of the bundled model: ~30 s of fixture setup here
def test_bundled_model_greedy_tokens_follow_hf(default_model_lazy, hf_default, chat_prompts):
    """dtype auto on the CPU (bfloat16, numba's kernel): greedy continuations checked against
    HF float32 teacher-forced on our own tokens, as tests/engine/test_parity_hf.py does for float32.
    bfloat16 activations and int8-rounded ones flip near-ties, so the bar is per token."""
    llm = LLM(model=default_model_lazy, device="cpu", dtype="auto", num_kv_blocks=64)
    assert llm.stats()["dtype"] == "bfloat16" and llm.stats()["weight_layout"] == "cpu-gemv"
    engine = llm.engine
    texts = [engine.apply_chat_template([{"role": "user", "content": p}]) for p in chat_prompts]
    prompts = [engine.tokenize(t)[1] for t in texts[:4]]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    agree = total = 0
    for ids, out in zip(prompts, llm.generate(prompts, params), strict=True):
        ours = out.outputs[0].token_ids
        with torch.no_grad():
            logits = hf_default(torch.tensor([ids + ours[:-1]])).logits[0, len(ids) - 1 :]
        agree += sum(a == b for a, b in zip(logits.argmax(-1).tolist(), ours, strict=True))
        total += len(ours)
    print(f"{agree}/{total} greedy tokens are HF float32's argmax")
    assert agree >= 0.9 * total, f"only {agree}/{total} greedy tokens are HF's argmax"


def test_prepare_says_when_a_first_compile_is_due(monkeypatch, tmp_path):
    """The worker's status line: a first compile is announced, a cached one is not, and a
    CUDA engine or numba switched off compiles nothing."""
    from kvscope.engine import cpu_kernels

    calls = []
    monkeypatch.setattr(cpu_kernels, "gemv_kernels", lambda: calls.append("load"))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    lines = []
    cpu_kernels.prepare_cpu_kernels("cpu", lines.append)
    assert lines == [cpu_kernels.COMPILING] and calls == ["load"]
    index = tmp_path / "kernels_x" / "cpu_gemv_jit.serial4-1.py311.nbi"
    index.parent.mkdir()
    index.write_bytes(b"")
    cpu_kernels.prepare_cpu_kernels("cpu", lines.append)
    assert lines == [cpu_kernels.COMPILING] and calls == ["load", "load"]
    cpu_kernels.prepare_cpu_kernels("cuda:0", lines.append)
    monkeypatch.setenv("KVSCOPE_CPU_QUANT_KERNEL", "torch")
    cpu_kernels.prepare_cpu_kernels("cpu", lines.append)
    assert calls == ["load", "load"]


LOADED_AFTER_LOAD = """
import json
from kvscope.kernels import cpu_decode, cpu_gemv
from kvscope.kernels import cpu_decode_jit, cpu_gemv_jit
assert cpu_decode.load() is not None
jitted = [f for m in (cpu_gemv_jit, cpu_decode_jit) for f in vars(m).values()
          if hasattr(f, "overloads") and f.__module__ == m.__name__]
print(json.dumps(sum(len(f.overloads) for f in jitted)))
"""


def _overloads_loaded(cache, tmp_path) -> int:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "KVSCOPE_DATA_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", LOADED_AFTER_LOAD], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.strip().splitlines()[-1])


def test_a_complete_cache_loads_each_kernel_on_its_first_call(tmp_path):
    """A warm launch loads only the variants its model calls (from a cache marked complete);
    a cache not marked so has every kernel loaded or compiled at load(), not mid-reply."""
    if not kernels_compiled():
        compile_all(torch.get_num_threads())
    complete = tmp_path / "complete"
    shutil.copytree(numba_dir(), complete)
    partial = tmp_path / "partial"
    shutil.copytree(numba_dir(), partial)
    (partial / cpu_gemv.COMPLETE_MARKER).unlink()
    assert _overloads_loaded(complete, tmp_path) == 0
    assert _overloads_loaded(partial, tmp_path) >= 20
