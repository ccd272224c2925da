"""`kvscope bench --mixed` (app/bench/mixed_step_bench.py): its figures' structure on a tiny
model, and that it leaves the engine as it found it. No timings are asserted."""

from __future__ import annotations

from tiny_models import make_quant_gguf

from kvscope.app.bench.mixed_step_bench import cpu_name, run_mixed, summarize_mixed
from kvscope.engine import LLM


def test_the_report_has_every_figure_and_the_engine_is_left_idle(tmp_path):
    path = make_quant_gguf(tmp_path / "m.gguf", "Q4_0", 1)
    llm = LLM(model=path, device="cpu", dtype="bfloat16", num_kv_blocks=64)
    sched = llm.engine.scheduler
    sched.prefill_beside_decodes = 16
    report = run_mixed(llm, prompt_tokens=20, decodes=2, long_prompt_tokens=40, rounds=2)
    assert sched.prefill_beside_decodes == 16 and not llm.engine.has_unfinished_requests()
    assert len(report.prefill_alone_ms) == len(report.mixed_ms) == 2
    # 40 prompt tokens at 16 a step beside decodes: 3 steps; uncapped, one.
    assert [len(g) for g in report.inter_token_capped_ms] == [3, 3]
    assert [len(g) for g in report.inter_token_uncapped_ms] == [1, 1]
    summary = report.summary()
    assert set(summary) >= {"prefill_alone_ms_per_token", "mixed_over_alone"}
    result = {"summary": summary, "cpu": cpu_name(), **report.__dict__}
    assert "inter-token median" in summarize_mixed(result)


def test_cpu_name_reads_the_model_name(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\n")
    assert cpu_name(info) == "Some CPU @ 2.0GHz"
