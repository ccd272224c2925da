"""`kvscope bench --gpu` on a machine without one, and its parts run small on CPU tensors."""

import pytest
import torch

from kvscope import kernels
from kvscope.app.bench.gpu.device import call_timer, datasheet_bandwidth
from kvscope.app.bench.gpu.engine_decode import engine_decode_point, random_prompts
from kvscope.app.bench.gpu.kernel_timing import kernel_checks, kernel_point
from kvscope.app.cli.main import main
from kvscope.engine import LLM, SamplingParams
from kvscope.engine.bench.contiguous_sdpa import ContiguousSdpaBaseline


def _triton_runs_on_cpu() -> bool:
    """Whether the Triton kernels run here in the interpreter (TRITON_INTERPRET=1, triton there)."""
    try:
        return kernels.resolve_backend("triton", torch.zeros(1)) == "triton"
    except ValueError:
        return False


needs_interpreter = pytest.mark.skipif(
    not _triton_runs_on_cpu(), reason="runs the Triton kernels in the interpreter"
)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_gpu_flag_without_gpu_exits_with_a_message(tmp_path, capsys):
    rc = main(["bench", "--gpu", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "needs an NVIDIA GPU" in err and "Traceback" not in err
    assert not (tmp_path / "bench_gpu.json").exists()


def test_peak_table_matches_device_names():
    assert datasheet_bandwidth("NVIDIA H100 80GB HBM3") == 3350
    assert datasheet_bandwidth("NVIDIA H100 PCIe") == 2000
    assert datasheet_bandwidth("NVIDIA A100-SXM4-40GB") == 1555
    assert datasheet_bandwidth("NVIDIA L4") == 300 and datasheet_bandwidth("NVIDIA L40S") == 864
    assert datasheet_bandwidth("NVIDIA A10G") == 600
    assert datasheet_bandwidth("Some Future GPU") is None


@needs_interpreter
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float8_e4m3fn])
def test_kernel_point_on_cpu(kv_dtype):
    timer = call_timer(torch.device("cpu"), iters=1, warmup=0)
    point = kernel_point(2, 40, (4, 2, 64), 16, torch.float32, kv_dtype, timer, torch.device("cpu"))
    assert point["ours_us"] > 0 and point["bytes_moved"] > 2 * 2 * 40 * 2 * 64
    if kv_dtype == torch.float32:
        assert point["max_abs_diff_vs_sdpa"] < 1e-4  # same K/V, paged vs contiguous
    else:
        assert "sdpa_us" not in point


@needs_interpreter
def test_kernel_checks_pass_on_cpu():
    """The bench's on-device correctness checks, run small in the interpreter (bfloat16 is left
    out: the interpreter's tl.dot mishandles it; the GPU run covers it)."""
    checks = kernel_checks(
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
    """The baseline runs the engine's own model on a contiguous cache: same greedy tokens."""
    llm = LLM(model=default_model, device="cpu", dtype="float32", num_kv_blocks=16)
    prompts = random_prompts(2, 12, default_model.config.vocab_size, seed=1)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]

    baseline = ContiguousSdpaBaseline(llm)
    decoder = baseline.decoder(batch=2, max_len=16)
    token = decoder.forward(torch.tensor(prompts), 0).argmax(-1, keepdim=True)
    tokens = [token]
    for pos in range(12, 15):
        token = decoder.forward(token, pos).argmax(-1, keepdim=True)
        tokens.append(token)
    assert torch.cat(tokens, dim=1).tolist() == expected

    point = engine_decode_point(llm, prompts, steps=2, warmup_steps=1)
    assert point["tokens_per_s"] > 0
    assert llm.stats()["kv_blocks_used"] == 0  # the point's requests were cleaned up
    assert baseline.decode_point(prompts, steps=2, warmup_steps=1)["tokens_per_s"] > 0
    # The engine still attends through its pool after the baseline's swapped forwards.
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected
