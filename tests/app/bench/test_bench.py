"""`kvscope bench` end to end on tiny settings: figures present, counts consistent, PNG valid."""

import json

import pytest
from PIL import Image

from kvscope.app.bench.allocator_bench import compare_allocators
from kvscope.app.bench.hf_baseline import useful_token_count
from kvscope.app.bench.run import BenchSettings, benchmark
from kvscope.app.bench.sharing_bench import measure_fork_blocks, measure_prefix_ttft
from kvscope.engine.bench.snapshot_cost import measure_snapshot_cost

TINY = dict(
    num_requests=3,
    max_tokens_cap=8,
    hf_sequential=1,
    decode_steps=4,
    bandwidth_bytes=1 << 24,
    skip_sharing=True,  # measured on its own below
    skip_allocators=True,  # likewise
    skip_structured=True,  # likewise
)


def _check_png(path):
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as image:
        image.verify()


def test_useful_tokens_stop_at_first_eos_and_budget():
    assert useful_token_count([5, 6, 2, 2, 2], max_tokens=5, eos_ids={2}) == 3
    assert useful_token_count([5, 6, 7, 8], max_tokens=2, eos_ids={2}) == 2
    assert useful_token_count([5, 6, 7, 2], max_tokens=3, eos_ids={2}) == 3
    assert useful_token_count([5, 6], max_tokens=8, eos_ids={2}) == 2


def test_bench_writes_consistent_report_and_plot(tmp_path, default_model, hf_default):
    report = benchmark(BenchSettings(out=tmp_path, **TINY), default_model, hf_default)
    on_disk = json.loads((tmp_path / "bench.json").read_text())
    assert on_disk["ours"] == report["ours"]
    _check_png(tmp_path / "bench.png")

    ours, static, seq = report["ours"], report["hf_static"], report["hf_sequential"]
    assert report["workload"]["num_requests"] == ours["num_requests"] == static["num_requests"] == 3
    # Our engine stops every request at EOS or its own budget: all generated tokens are useful.
    assert ours["useful_tokens"] == sum(ours["generated_tokens"])
    assert all(1 <= n <= 8 for n in ours["generated_tokens"])
    assert static["useful_tokens"] == sum(static["useful_tokens_by_request"])
    assert all(1 <= n <= 8 for n in static["useful_tokens_by_request"])
    assert static["useful_tokens"] <= static["generated_slots"]
    assert 0.0 <= static["wasted_token_share"] < 1.0
    assert seq["num_requests"] == seq["batch_size"] == 1
    quantized = report["ours_quantized"]
    # The engine as users run it: the GGUF kept quantized, bfloat16 with numba's kernels.
    assert quantized["dtype"] == "bfloat16" and quantized["weight_layout"] == "cpu-gemv"
    assert quantized["useful_tokens"] == sum(quantized["generated_tokens"])
    assert all(1 <= n <= 8 for n in quantized["generated_tokens"])
    for run in (ours, quantized, static, seq):
        assert run["useful_tokens_per_s"] > 0 and run["wall_s"] > 0
    assert ours["ttft_p50_s"] <= ours["ttft_p90_s"]

    decode = report["decode_batch1"]
    assert decode["roofline"]["bandwidth_gb_s"] > 0
    assert decode["roofline"]["bytes_per_token"] > decode["roofline"]["weight_bytes"] > 0
    keys = ("ours_tokens_per_s", "hf_tokens_per_s", "ours_pct_of_roofline")
    for key in (*keys, "ours_quantized_tokens_per_s", "ours_quantized_pct_of_roofline"):
        assert decode[key] > 0
    for target in report["targets"].values():
        assert target["ratio"] > 0 and isinstance(target["met"], bool)
    assert report["machine"]["cpu_count"] >= 1 and report["runtime_s"] > 0
    phases = {"ours_workload", "ours_decode", "hf_static", "hf_sequential", "hf_decode"}
    phases |= {"ours_quantized_workload", "ours_quantized_decode"}
    assert phases <= report["machine"]["cpu_stall_share"].keys()


def test_bench_without_hf_leaves_hf_figures_empty(tmp_path, default_model):
    report = benchmark(BenchSettings(out=tmp_path, skip_hf=True, **TINY), default_model)
    assert report["hf_static"] is None and report["hf_sequential"] is None
    assert report["decode_batch1"]["hf_tokens_per_s"] is None
    assert report["targets"]["useful_throughput_vs_hf_static"]["met"] is None
    assert report["targets"]["decode_batch1_vs_roofline"]["ratio"] > 0
    _check_png(tmp_path / "bench.png")


@pytest.fixture()
def short_agent_workload(tmp_path):
    """The bundled agent workload cut to ~400 system-prompt tokens (25 blocks of 16, 1387 in
    full) and three questions: the same shared-prefix and fork shapes at a quarter of the
    prefill work. `kvscope bench` measures the full one."""
    from kvscope.app.core.paths import ASSETS_DIR

    workload = json.loads((ASSETS_DIR / "chat_mixed.json").read_text())
    agent = workload["agent"]
    short = {"system_prompt": agent["system_prompt"][:1600], "questions": agent["questions"][:3]}
    path = tmp_path / "agent_short.json"
    path.write_text(json.dumps({"agent": short}))
    return path


@pytest.mark.slow
def test_sharing_figures(default_model_lazy, short_agent_workload):
    # The engine as a user gets it (the GGUF's weights kept, numba's int8 kernels): the same
    # blocks and cache hits as float32, and its prefill ~2.5x faster here (the test's cost).
    # The six engines build from one in-memory read of the file (the same kept tensors): half
    # of their build time here is reading and decoding the GGUF blocks again.
    kept = default_model_lazy.materialized("auto")
    ttft = measure_prefix_ttft(kept, short_agent_workload, dtype="auto")
    # Every agent question after the first finds the shared system prompt's full blocks.
    assert ttft["cached_tokens_mean"] >= ttft["prompt_tokens_mean"] - 64
    assert ttft["cold_ttft_mean_s"] > 0 and ttft["cached_ttft_mean_s"] > 0
    fork = measure_fork_blocks(kept, short_agent_workload, dtype="auto")
    prompt_blocks = fork["prompt_tokens"] // 16
    assert prompt_blocks >= 20  # long enough that sharing its blocks dominates the peaks
    # Four uncached copies hold the prompt four times; n=4 holds its full blocks once.
    assert fork["peak_blocks_independent"] >= 4 * prompt_blocks
    assert prompt_blocks <= fork["peak_blocks_n4"] < fork["peak_blocks_independent_prefix_cached"]
    assert fork["peak_blocks_independent_prefix_cached"] <= fork["peak_blocks_independent"]
    assert fork["met"] and fork["peak_blocks_beam"] < fork["peak_blocks_independent"]


def test_allocator_comparison_on_one_pool(default_model, chat_prompts):
    from kvscope.engine import LLM

    engine = LLM(model=default_model, device="cpu", dtype="float32", num_kv_blocks=4).engine
    prompts = [
        engine.tokenize(engine.apply_chat_template([{"role": "user", "content": p}]))[1]
        for p in chat_prompts[:6]
    ]
    report = compare_allocators(default_model, prompts, [6] * 6, num_blocks=32, max_model_len=128)
    paged, naive = report["paged"], report["contiguous"]
    assert paged["generated_tokens"] == naive["generated_tokens"] == 36
    # 32 blocks / 8 per 128-token reservation: 4 at once; the paged pool runs all 6.
    assert naive["peak_concurrent_sequences"] == 4 and paged["peak_concurrent_sequences"] == 6
    assert report["concurrency_ratio"] == 1.5
    assert naive["useful_slot_share_mean"] < 0.5 < paged["useful_slot_share_mean"] <= 1.0
    assert naive["num_preemptions"] == 0
    assert set(report["targets"]) == {
        "concurrency_ratio",
        "paged_useful_share",
        "contiguous_useful_share",
    }


def test_snapshot_cost_is_measured_on_a_full_pool():
    cost = measure_snapshot_cost(num_blocks=6400, repeats=3)
    assert cost["blocks_used"] == 6400 and cost["snapshot_ms_median"] > 0
