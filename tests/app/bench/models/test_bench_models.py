"""`kvscope bench --models` on a tiny synthetic shape: the file, the probe process, JSON + PNG."""

import json

import pytest

from kvscope.app.bench.models.bench import run_models_bench
from kvscope.engine.bench.synthetic_gguf import Shape
from kvscope.engine.model.loader import load_model


@pytest.mark.slow
def test_models_bench_end_to_end(tmp_path):
    tiny = Shape("tiny", layers=2, hidden=256, intermediate=512, heads=4, kv_heads=2, context=256)
    report = run_models_bench(tmp_path / "out", tmp_path / "cache", shapes=[tiny])
    assert (tmp_path / "out" / "bench_models.png").stat().st_size > 10_000
    saved = json.loads((tmp_path / "out" / "bench_models.json").read_text())
    assert saved == report
    auto, none = report["runs"]
    assert (auto["quantization"], none["quantization"]) == ("auto", "none")
    assert auto["weight_format"] == "Q4_K+Q6_K" and none["weight_layout"] == "dense"
    assert auto["dtype"] == "bfloat16" and none["dtype"] == "float32"
    assert auto["weight_bytes"] < none["weight_bytes"] / 3
    for run in report["runs"]:
        assert run["peak_rss"] >= run["rss_after_load"] > run["rss_before_load"] > 0
        assert run["decode"]["1"]["tokens_per_s"] > 0 and run["decode"]["16"]["steps"] == 7
        assert run["planned"]["weights"] > 0
    # The synthetic file is a real GGUF: the bundled tokenizer and chat template came along.
    loaded = load_model(auto["file"])
    assert loaded.config.num_layers == 2 and loaded.tokenizer.chat_template
