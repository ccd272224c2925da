"""Sliding layers in the arithmetic: ModelConfig's windows, the loader's reading of Mistral and
Qwen2 configs, the planner and the settings dialog counting sliding layers at their window, and
the `kvscope bench --sliding` curves (a short run)."""

import json

import pytest

from kvscope.engine.model.hf_loader import _sliding
from kvscope.engine.model.model_config import FULL, SLIDING, ModelConfig
from kvscope.engine.sizing import planner


def _config(**kw) -> ModelConfig:
    base = dict(
        architecture="gemma3",
        vocab_size=1000,
        hidden_size=640,
        intermediate_size=2048,
        num_layers=18,
        num_heads=4,
        num_kv_heads=1,
        head_dim=256,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    )
    return ModelConfig(**{**base, **kw})


GEMMA_TYPES = tuple(FULL if i % 6 == 5 else SLIDING for i in range(18))


def test_layer_window_follows_layer_types():
    gemma = _config(sliding_window=512, layer_types=GEMMA_TYPES)
    assert gemma.layer_window(0) == 512 and gemma.layer_window(5) is None
    assert gemma.layer_windows().count(None) == 3
    mistral = _config(architecture="mistral", sliding_window=4096)
    assert mistral.layer_windows() == (4096,) * 18  # no layer_types: every layer slides
    assert _config().layer_windows() == (None,) * 18


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"sliding_window": 0}, "sliding_window must be >= 1"),
        ({"sliding_window": 8, "layer_types": (SLIDING,) * 3}, "3 entries, the model has 18"),
        ({"sliding_window": 8, "layer_types": ("local",) * 18}, "unknown layer types"),
        ({"layer_types": GEMMA_TYPES}, "sliding_window is None"),
    ],
)
def test_bad_window_fields_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        _config(**kw)


def test_hf_configs_honour_the_window_instead_of_capping_the_context():
    assert _sliding({"sliding_window": 4096}, "mistral") == {"sliding_window": 4096}
    assert _sliding({"sliding_window": None}, "mistral") == {}
    qwen = {"sliding_window": 4096, "num_hidden_layers": 4, "max_window_layers": 2}
    assert _sliding(qwen, "qwen2") == {}  # use_sliding_window is off by default
    on = _sliding({**qwen, "use_sliding_window": True}, "qwen2")
    assert on == {"sliding_window": 4096, "layer_types": (FULL, FULL, SLIDING, SLIDING)}
    assert _sliding({**qwen, "use_sliding_window": True, "max_window_layers": 4}, "qwen2") == {}


def test_planner_counts_sliding_layers_at_their_window():
    gemma = _config(sliding_window=512, layer_types=GEMMA_TYPES)
    full = _config()
    plan = planner.plan_kv(gemma, context=32768, dtype="fp16", vram_bytes="8GiB", weights_bytes=0)
    plan_full = planner.plan_kv(
        full, context=32768, dtype="fp16", vram_bytes="8GiB", weights_bytes=0
    )
    per_layer_token = 2 * 1 * 256 * 2
    assert plan.bytes_per_sequence == per_layer_token * (3 * 32768 + 15 * 512)
    assert plan_full.bytes_per_sequence == per_layer_token * 18 * 32768
    assert plan.kv_groups == 6 and plan.sliding_layers == 15 and plan.sliding_window == 512
    assert plan.bytes_per_block == 16 * 3 * per_layer_token  # a block holds one group's 3 layers
    # Full group: 2048 blocks; five sliding groups: ceil(511 / 16) + 1 = 33 blocks each.
    assert plan.blocks_per_sequence == 2048 + 5 * 33
    assert plan.max_sequences_at_context > 5 * plan_full.max_sequences_at_context
    assert "15 of 18 keep a 512-token window" in plan.table()
    assert planner.blocks_per_context(gemma, 16, 100) == 6 * 7  # under the window: every block
    assert planner.predict_num_blocks(gemma, 16, "fp16", 16 * 3 * per_layer_token * 10) == 10


def test_sliding_bench_flattens_with_windows_and_grows_without(tmp_path):
    from kvscope.app.bench.sliding_bench import plot_sliding, summarize_sliding
    from kvscope.engine.bench.sliding_window import run_sliding_bench

    report = run_sliding_bench(
        tmp_path / "out", tmp_path / "models", num_tokens=60, window=16, models=("mistral",)
    )
    honoured, ignored = report["runs"]
    assert honoured["windows_honoured"] and not ignored["windows_honoured"]
    assert honoured["same_tokens_as_ignored"]
    # Window 16, blocks of 8: at most ceil(15 / 8) + 1 = 3 blocks, while 76 tokens take 10.
    assert honoured["peak_blocks"] <= 3 < ignored["peak_blocks"] == 10
    assert honoured["blocks_released"] == 10 - honoured["final_blocks"]
    plot_sliding(report, tmp_path / "sliding.png")
    assert (tmp_path / "sliding.png").stat().st_size > 0
    assert json.loads((tmp_path / "out" / "bench_sliding.json").read_text())["window"] == 16
    assert "windows honoured: peak" in summarize_sliding(report)
