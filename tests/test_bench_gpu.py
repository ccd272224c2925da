"""`kvscope bench --gpu` on a machine without one, and its parts run small on CPU tensors."""

import pytest
import torch

from app.bench import gpu
from app.cli import main
from engine import LLM, SamplingParams
from kernels import triton_kernels as tk


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_gpu_flag_without_gpu_exits_with_a_message(tmp_path, capsys):
    rc = main(["bench", "--gpu", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "needs an NVIDIA GPU" in err and "Traceback" not in err
    assert not (tmp_path / "bench_gpu.json").exists()


def test_peak_table_matches_device_names():
    def peak(name):
        return next(gb for frag, gb in gpu.PEAK_BANDWIDTH_GB_S if frag in name)

    assert peak("NVIDIA H100 80GB HBM3") == 3350
    assert peak("NVIDIA H100 PCIe") == 2000
    assert peak("NVIDIA A100-SXM4-40GB") == 1555
    assert peak("NVIDIA L4") == 300 and peak("NVIDIA L40S") == 864
    assert peak("NVIDIA A10G") == 600


@pytest.mark.skipif(not tk.INTERPRETED, reason="runs the Triton kernel in the interpreter")
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float8_e4m3fn])
def test_kernel_point_on_cpu(kv_dtype):
    timer = gpu._timer(torch.device("cpu"), iters=1, warmup=0)
    point = gpu.kernel_point(
        2, 40, (4, 2, 64), 16, torch.float32, kv_dtype, timer, torch.device("cpu")
    )
    assert point["ours_us"] > 0 and point["bytes_moved"] > 2 * 2 * 40 * 2 * 64
    if kv_dtype == torch.float32:
        assert point["max_abs_diff_vs_sdpa"] < 1e-4  # same K/V, paged vs contiguous
    else:
        assert "sdpa_us" not in point


@pytest.mark.skipif(not tk.INTERPRETED, reason="runs the Triton kernels in the interpreter")
def test_kernel_checks_pass_on_cpu():
    """The bench's on-device correctness checks, run small in the interpreter (bfloat16 is left
    out: the interpreter's tl.dot mishandles it; the GPU run covers it)."""
    checks = gpu.kernel_checks(
        torch.device("cpu"),
        [torch.float32, torch.float16],
        shapes=((4, 2, 64),),
        lens=(1, 20, 70),
        news=(1, 5, 30),
        fp8=True,
    )
    assert [(c["dtype"], c["kv_dtype"]) for c in checks] == [
        ("float32", "float32"),
        ("float32", "float8_e4m3fn"),
        ("float16", "float16"),
        ("float16", "float8_e4m3fn"),
    ]
    assert all(c["ok"] for c in checks), checks


def test_contiguous_sdpa_baseline_decodes_like_the_engine(default_model):
    """The baseline does the engine's math on a contiguous cache: same greedy tokens."""
    llm = LLM(model=default_model, device="cpu", dtype="float32", num_kv_blocks=16)
    prompts = gpu._prompts(2, 12, default_model.config.vocab_size, seed=1)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]

    decoder = gpu.ContiguousSdpaDecoder(llm.engine.model, batch=2, max_len=16)
    token = decoder.forward(torch.tensor(prompts), 0).argmax(-1, keepdim=True)
    tokens = [token]
    for pos in range(12, 15):
        token = decoder.forward(token, pos).argmax(-1, keepdim=True)
        tokens.append(token)
    assert torch.cat(tokens, dim=1).tolist() == expected

    point = gpu.engine_decode_point(llm, prompts, steps=2, warmup_steps=1)
    assert point["tokens_per_s"] > 0
    assert llm.stats()["kv_blocks_used"] == 0  # the point's requests were cleaned up
    point = gpu.sdpa_decode_point(llm.engine.model, prompts, steps=2, warmup_steps=1)
    assert point["tokens_per_s"] > 0
