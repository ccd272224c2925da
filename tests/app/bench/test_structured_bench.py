"""The structured-outputs bench on a short run: both runs do the same work (every request runs
its max_tokens), and the report carries the figures the README quotes."""

from kvscope.app.bench.structured_bench import NUM_REQUESTS, measure_structured
from kvscope.engine import LLM


def test_structured_bench_reports_like_for_like_runs(default_model):
    llm = LLM(model=default_model, device="cpu", dtype="float32", num_kv_blocks=256)
    engine = llm.engine
    prompt = engine.tokenize(engine.apply_chat_template([{"role": "user", "content": "Hi"}]))[1]
    report = measure_structured(llm, [prompt], max_tokens=8, rounds=1)
    for run in (*report["unconstrained_runs"], *report["mixed_runs"]):
        assert run["output_tokens"] == NUM_REQUESTS * 8  # no request stopped early
    assert report["mixed_over_unconstrained"] > 0 and report["free_requests_ratio"] > 0
    assert report["mask_ms_per_token"] > 0
    assert set(report["compile_ms"]) == {
        "tokenizer_once",
        "small_object",
        "long_notes",
        "enum_1000",
        "nested_8",
    }
    engine.allocator.check_invariants()
    assert engine.allocator.num_used_blocks == 0
