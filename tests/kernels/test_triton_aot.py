"""Every Triton kernel compiles, ahead of time and with no GPU, for the GPUs the app supports:
compute capability 7.5 (Turing) to 12.0 (consumer Blackwell), down to a cubin, within the
target's shared memory.

What gets compiled is what the launchers really launch. Each case calls a launcher
(`triton_store.store_kv_triton`, `triton_decode.paged_decode_attention_triton`,
`triton_prefill.paged_prefill_attention_triton`, `triton_quant.quantized_matmul_triton`) on CPU
tensors shaped like a real model's, with `JITFunction.run` swapped for a recorder: the recorded
launches carry the launcher's own constexprs (tiles, flags), num_warps / num_stages, dtypes and
strides. Each launch is then compiled through Triton's JIT path (`JITFunction.run(...,
warmup=True)`: the JIT's argument specialization, `ASTSource`, `triton.compile` to a cubin with
the ptxas the triton wheel bundles; no network, no CUDA toolkit) against a stand-in driver that
reports `GPUTarget("cuda", cc, 32)`. The launchers see that driver too, so one that picks tiles
by target (the quantized matmul: FMA tiles below sm_80) is compiled with the tiles it would pick
on that GPU. Each compile also records the @triton.jit helpers its code generator inlined (the
ones its constexprs reach), so the helpers `triton_common` shares are checked to compile inside
both attention kernels.

The compiles run in worker processes (this file run as a script): conftest sets TRITON_INTERPRET=1
for the test session, and under it `@triton.jit` gives interpreter functions that do not compile.
Items are spread over one worker per core, into a fresh Triton cache, so each compile really
happens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

# Computed here, not taken from tests/repo_paths.py: this file also runs as a script (the compile
# workers), with only its own folder on the path.
ROOT = Path(__file__).resolve().parents[2]

# Compiling ~200 kernel variants takes minutes: `make test` runs it, `make test-fast` does not.
pytestmark = pytest.mark.slow

ALL_CAPABILITIES = (75, 80, 86, 89, 90, 120)
# `make test` compiles for the consumer GPUs the app is for (RTX 20, 30, 40 and 50 series) and
# `make test-aot` for all six, the data-centre sm_80 and sm_90 too: the compiles are a third of
# the suite's CPU time (675 s for six targets), and the suite has 15 minutes on two cores. sm_80
# loses little: the launchers choose their tiles by one threshold (below 80: FMA tiles), so it
# compiles what sm_86 compiles, under a larger shared-memory limit (166912 against 101376).
CAPABILITIES = ALL_CAPABILITIES if os.environ.get("KVSCOPE_AOT_ALL") else (75, 86, 89, 120)
FP8_MIN_CC = 89  # engine.config.FP8_MIN_CUDA_CAPABILITY, checked below
# Shared memory one block may opt into (cudaDevAttrMaxSharedMemoryPerBlockOptin): a launch that
# needs more fails on the device with OutOfResources, after compiling fine.
SMEM_LIMIT = {75: 65536, 80: 166912, 86: 101376, 89: 101376, 90: 232448, 120: 101376}

# A Llama-8B-like attention shape: 32 query heads, 8 KV heads, head dim 128, blocks of 16.
HQ, HKV, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 32, 8, 128, 16, 64
HIDDEN, INTERMEDIATE = 4096, 1024  # a quantized projection [N, K] = [INTERMEDIATE, HIDDEN]
# Quantized layouts: (bits, group, super-group, d dtype name, sub-scales "none"/"both"/"shared")
# The modules with @triton.jit code, the kernels that share `triton_common`'s helpers, and the
# helpers no GPU compile reaches (`triton_quant.EMULATE_BF16` is for the interpreter).
JIT_MODULES = ("triton_common", "triton_store", "triton_decode", "triton_prefill", "triton_quant")
ATTENTION_KERNELS = ("_decode_kernel", "_prefill_kernel")
INTERPRETER_ONLY_HELPERS = {"_round_to_bf16"}
QUANT_LAYOUTS = {
    "Q4_K": (4, 32, 256, "float16", "both"),
    "int4": (4, 128, 128, "float32", "none"),
    "Q6_K": (8, 16, 256, "float16", "shared"),
    "Q8_0": (8, 32, 32, "float16", "none"),
}


def _dtype(name):
    import torch

    return {"fp8": torch.float8_e4m3fn}.get(name) or getattr(torch, name)


def _qkv(tokens, dtype):
    """q, k, v as views into one fused projection output, as the model hands them over."""
    import torch

    qkv = torch.zeros(tokens, (HQ + 2 * HKV) * HEAD_DIM, dtype=dtype)
    q = qkv[:, : HQ * HEAD_DIM].view(tokens, HQ, HEAD_DIM)
    k = qkv[:, HQ * HEAD_DIM : (HQ + HKV) * HEAD_DIM].view(tokens, HKV, HEAD_DIM)
    v = qkv[:, (HQ + HKV) * HEAD_DIM :].view(tokens, HKV, HEAD_DIM)
    return q, k, v


def _caches(cache_dtype):
    import torch

    shape = (NUM_BLOCKS, BLOCK_SIZE, HKV, HEAD_DIM)
    k_cache = torch.zeros(shape, dtype=cache_dtype)
    v_cache = torch.zeros(shape, dtype=cache_dtype)
    if cache_dtype != torch.float8_e4m3fn:
        return k_cache, v_cache, None, None
    return k_cache, v_cache, torch.ones(HKV), torch.ones(HKV)


def _store(dtype, cache):
    import torch

    from kvscope.kernels.triton_store import store_kv_triton

    _, k, v = _qkv(8, _dtype(dtype))
    k_cache, v_cache, k_scale, v_scale = _caches(_dtype(cache))
    slots = torch.arange(8, dtype=torch.int64)
    store_kv_triton(k, v, k_cache, v_cache, slots, k_scale, v_scale)


def _decode(dtype, cache, num_splits, window=None):
    import torch

    from kvscope.kernels.triton_decode import paged_decode_attention_triton

    batch = 4
    q, _, _ = _qkv(batch, _dtype(dtype))
    k_cache, v_cache, k_scale, v_scale = _caches(_dtype(cache))
    tables = torch.zeros(batch, NUM_BLOCKS, dtype=torch.int32)
    seq_lens = torch.full((batch,), 100, dtype=torch.int32)
    args = (q, k_cache, v_cache, tables, seq_lens, HEAD_DIM**-0.5, k_scale, v_scale)
    paged_decode_attention_triton(*args, sliding_window=window, num_splits=num_splits)


def _prefill(dtype, cache, window=None):
    import torch

    from kvscope.kernels.triton_prefill import paged_prefill_attention_triton

    q, _, _ = _qkv(96, _dtype(dtype))
    k_cache, v_cache, k_scale, v_scale = _caches(_dtype(cache))
    tables = torch.zeros(2, NUM_BLOCKS, dtype=torch.int32)
    starts = torch.tensor([0, 64, 96], dtype=torch.int32)
    seq_lens = torch.tensor([64, 40], dtype=torch.int32)
    args = (q, k_cache, v_cache, tables, starts, seq_lens, HEAD_DIM**-0.5, k_scale, v_scale)
    paged_prefill_attention_triton(*args, sliding_window=window)


def _quant(dtype, layout, m):
    import torch

    from kvscope.kernels import triton_quant as tq
    from kvscope.kernels.quant_format import QuantizedTensor

    bits, group, super_group, d_dtype, sub = QUANT_LAYOUTS[layout]
    n, k = INTERMEDIATE, HIDDEN
    codes = torch.zeros(n, k // 2 if bits == 4 else k, dtype=torch.uint8)
    d = torch.zeros(n, k // super_group, dtype=_dtype(d_dtype))
    sub_scale = None if sub == "none" else torch.zeros(n, k // group, dtype=torch.int8)
    sub_min = sub_scale if sub == "shared" else None if sub == "none" else sub_scale.clone()
    w = QuantizedTensor((n, k), bits, group, super_group, codes, d, d.clone(), sub_scale, sub_min)
    tq.quantized_matmul_triton(torch.zeros(m, k, dtype=_dtype(dtype)), w)


def _cases() -> dict[str, tuple]:
    """case id -> (builder, args, minimum cc)."""
    cases = {}
    for dt in ("float16", "bfloat16", "float32"):
        cases[f"store[{dt}]"] = (_store, (dt, dt), 0)
        cases[f"decode[{dt}]"] = (_decode, (dt, dt, 1), 0)
        cases[f"decode-split[{dt}]"] = (_decode, (dt, dt, 4), 0)  # + the reduce kernel
        cases[f"prefill[{dt}]"] = (_prefill, (dt, dt), 0)
    # A sliding window (an odd one: the runtime int is not specialized as divisible by 16).
    for dt in ("bfloat16", "float32"):
        cases[f"decode-window[{dt}]"] = (_decode, (dt, dt, 1, 509), 0)
        cases[f"decode-split-window[{dt}]"] = (_decode, (dt, dt, 4, 509), 0)
        cases[f"prefill-window[{dt}]"] = (_prefill, (dt, dt, 33), 0)
    for dt in ("float16", "bfloat16"):  # fp8 KV cache: only where the engine allows it
        cases[f"store[{dt}/fp8]"] = (_store, (dt, "fp8"), FP8_MIN_CC)
        cases[f"decode[{dt}/fp8]"] = (_decode, (dt, "fp8", 1), FP8_MIN_CC)
        cases[f"decode-split[{dt}/fp8]"] = (_decode, (dt, "fp8", 4), FP8_MIN_CC)
        cases[f"prefill[{dt}/fp8]"] = (_prefill, (dt, "fp8"), FP8_MIN_CC)
    # Quantized matmul: decode tiles (M = 1, which Triton specializes, and M = 24) and prefill
    # tiles (M = 512); 4- and 8-bit layouts; every activation dtype, bfloat16 on every layout.
    quant = [("bfloat16", layout) for layout in QUANT_LAYOUTS]
    quant += [("float16", "Q4_K"), ("float16", "Q6_K"), ("float32", "Q4_K"), ("float32", "Q8_0")]
    for dt, layout in quant:
        for config, m in (("decode", 1 if layout in ("Q4_K", "int4") else 24), ("prefill", 512)):
            cases[f"quant-{config}[{dt},{layout}]"] = (_quant, (dt, layout, m), 0)
    return cases


CASES = _cases()
ITEMS = [(case, cc) for cc in CAPABILITIES for case, (*_, min_cc) in CASES.items() if cc >= min_cc]


# ---- worker (this file as a script, without TRITON_INTERPRET) ---------------------------------
class _StandInDriver:
    """What Triton's JIT and the launchers ask the driver, answered for GPU `cc`. The device id
    is the cc, so the JIT's per-device kernel caches keep targets apart."""

    def __init__(self, cc: int) -> None:
        self.cc = cc

    def get_current_device(self) -> int:
        return self.cc

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", self.cc, 32)


def _record_launches(call) -> list:
    from triton.runtime.jit import JITFunction

    launches = []

    def record(self, *args, grid, warmup, **kwargs):
        launches.append((self, args, kwargs))

    real = JITFunction.run
    JITFunction.run = record
    try:
        call()
    finally:
        JITFunction.run = real
    return launches


def _record_inlined(inlined: set) -> None:
    """From now on, add the name of every @triton.jit function a kernel's code generator
    inlines (a call it generates code for) to `inlined`."""
    from triton.compiler.code_generator import CodeGenerator

    real = CodeGenerator.call_JitFunction

    def record(self, fn, *args, **kwargs):
        inlined.add(fn.__name__)
        return real(self, fn, *args, **kwargs)

    CodeGenerator.call_JitFunction = record


def _compile_items(items: list) -> list[dict]:
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    inlined = set()
    _record_inlined(inlined)
    results = []
    for case, cc in items:
        builder, args, _ = CASES[case]
        driver.set_active(_StandInDriver(cc))
        try:
            launches = _record_launches(lambda b=builder, a=args: b(*a))
        except Exception:
            error = traceback.format_exc()
            results.append(dict(case=case, cc=cc, kernel="(launcher)", ok=False, error=error))
            continue
        if not launches:
            results.append(dict(case=case, cc=cc, kernel="-", ok=False, error="nothing launched"))
        for fn, fn_args, kwargs in launches:
            start = time.perf_counter()
            row = dict(case=case, cc=cc, kernel=fn.__name__, num_warps=kwargs.get("num_warps"))
            inlined.clear()
            try:
                compiled = JITFunction.run(fn, *fn_args, grid=(1,), warmup=True, **kwargs)
                assert "cubin" in compiled.asm, "no cubin came out"
                row.update(ok=True, shared=compiled.metadata.shared, inlined=sorted(inlined))
            except Exception:
                row.update(ok=False, error=traceback.format_exc()[-4000:])
            row["seconds"] = round(time.perf_counter() - start, 2)
            results.append(row)
    return results


def _worker_main(out_path: str, items_json: str) -> None:
    assert not os.environ.get("TRITON_INTERPRET"), "the worker compiles: no interpreter"
    items = [tuple(item) for item in json.loads(items_json)]
    Path(out_path).write_text(json.dumps(_compile_items(items)))


# ---- tests ------------------------------------------------------------------------------------
def _selected_items(session) -> list:
    """The (case, cc) items this session runs: all of them unless `-k` & co. picked a few."""
    here = Path(__file__).resolve()
    picked, everything = set(), False
    for item in session.items:
        if Path(item.path).resolve() != here:
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "case" in params:
            picked.add((params["case"], params["cc"]))
        elif item.name == "test_every_kernel_is_covered":
            everything = True
    return ITEMS if everything else [it for it in ITEMS if it in picked]


@pytest.fixture(scope="module")
def compiled(request, tmp_path_factory):
    """(case, cc) -> the worker's rows for it; each selected item compiled once per module."""
    pytest.importorskip("triton")
    items = _selected_items(request.session)
    tmp = tmp_path_factory.mktemp("aot")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp / "triton-cache")
    # No source-line debug info in the LLVM IR, PTX and cubin: nothing here reads it, and
    # leaving it out saves ~9% of the compile time. What is checked (every stage down to a
    # cubin, the shared memory each kernel needs, which helpers got inlined) is the same.
    env["TRITON_DISABLE_LINE_INFO"] = "1"
    workers = max(1, min(os.cpu_count() or 1, 4, len(items)))
    procs = []
    for i in range(workers):
        out = tmp / f"worker{i}.json"
        cmd = [sys.executable, __file__, str(out), json.dumps(items[i::workers])]
        log = open(tmp / f"worker{i}.log", "w")
        procs.append((subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=log), out, log))
    rows = []
    for proc, out, log in procs:
        try:
            proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
        if proc.returncode != 0 or not out.exists():
            tail = Path(log.name).read_text()[-4000:]
            pytest.fail(f"AOT worker exited with {proc.returncode}:\n{tail}")
        rows += json.loads(out.read_text())
    by_item = {}
    for row in rows:
        by_item.setdefault((row["case"], row["cc"]), []).append(row)
    return by_item


def test_fp8_capability_matches_the_engine():
    from kvscope.engine.config import FP8_MIN_CUDA_CAPABILITY

    major, minor = FP8_MIN_CUDA_CAPABILITY
    assert FP8_MIN_CC == 10 * major + minor


@pytest.mark.parametrize("case,cc", ITEMS, ids=[f"sm{cc}-{case}" for case, cc in ITEMS])
def test_kernel_compiles(compiled, case, cc):
    rows = compiled.get((case, cc))
    assert rows, f"{case} on sm_{cc}: the worker returned nothing"
    for row in rows:
        where = f"{row['kernel']} ({case}) for sm_{cc}"
        assert row["ok"], f"{where} failed to compile:\n{row['error']}"
        assert row["shared"] <= SMEM_LIMIT[cc], (
            f"{where} needs {row['shared']} bytes of shared memory; sm_{cc} has "
            f"{SMEM_LIMIT[cc]} per block"
        )


def _jit_functions() -> dict[str, str]:
    """name -> module for each @triton.jit function the kernels package defines."""
    import importlib

    functions = {}
    for module_name in JIT_MODULES:
        module = importlib.import_module(f"kvscope.kernels.{module_name}")
        for name, obj in vars(module).items():
            if hasattr(obj, "fn") and obj.fn.__module__ == module.__name__:
                functions[name] = module_name
    return functions


def test_every_kernel_is_covered(compiled):
    """Each @triton.jit kernel of the kernels package is compiled by some case on every cc; each
    helper `triton_common` defines is inlined into both attention kernels on every cc; every
    other helper is inlined into some compiled kernel, unless it serves the interpreter only."""
    functions = _jit_functions()
    kernel_names = {name for name in functions if name.endswith("_kernel")}
    shared = {name for name, module in functions.items() if module == "triton_common"}
    assert shared, "triton_common defines no @triton.jit helper"
    rows = [row for item_rows in compiled.values() for row in item_rows if row["ok"]]
    for cc in CAPABILITIES:
        seen = {row["kernel"] for row in rows if row["cc"] == cc}
        assert kernel_names <= seen, f"sm_{cc}: never compiled {sorted(kernel_names - seen)}"
        for kernel in ATTENTION_KERNELS:
            inlined = set().union(
                *(row["inlined"] for row in rows if row["cc"] == cc and row["kernel"] == kernel)
            )
            missing = shared - inlined
            assert not missing, f"sm_{cc}: {kernel} never compiled with {sorted(missing)} inlined"
    helpers = set(functions) - kernel_names - shared - INTERPRETER_ONLY_HELPERS
    inlined_anywhere = set().union(*(row["inlined"] for row in rows))
    assert helpers <= inlined_anywhere, f"never compiled: {sorted(helpers - inlined_anywhere)}"


if __name__ == "__main__":
    _worker_main(sys.argv[1], sys.argv[2])
