"""The KV planner: seed figures, byte parsing, model configs without weights, the real pool, CLI."""

import json
from dataclasses import replace

import pytest
import torch
from tiny_models import make_tiny_gguf, make_tiny_model

from kvscope.app.cli.main import main
from kvscope.engine import LLM
from kvscope.engine.config import KV_DTYPES
from kvscope.engine.model.gguf.file import read_gguf
from kvscope.engine.model.gguf.loader import gguf_config, load_gguf
from kvscope.engine.model.hf_loader import load_hf_folder
from kvscope.engine.sizing.planner import (
    dtype_name,
    estimate_weight_bytes,
    model_config,
    parse_bytes,
    plan_kv,
    predict_num_blocks,
)

GiB = 1 << 30
ENGINE_FLOAT_DTYPES = ("float32", "float16", "bfloat16")
LLAMA2_13B = dict(num_layers=40, num_kv_heads=40, head_dim=128)
LLAMA3_8B = dict(num_layers=32, num_kv_heads=8, head_dim=128)
# Llama-3-8B's config.json, as far as the planner and the engine read it.
LLAMA3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}


def _plan_json(capsys, *argv: str) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_llama2_13b_batch_does_not_fit_a_24gib_card(capsys):
    plan = _plan_json(
        capsys,
        *("--layers", "40", "--kv-heads", "40", "--head-dim", "128", "--dtype", "fp16"),
        *("--context", "4096", "--batch", "8", "--vram", "24GiB", "--weights", "7.5GiB"),
    )
    assert plan["bytes_per_token"] == 819_200
    assert plan["bytes_per_sequence"] == 819_200 * 4096
    assert plan["batch_bytes"] == 26_843_545_600
    assert plan["kv_budget_bytes"] == int(24 * GiB * 0.9) - 7.5 * GiB
    assert plan["fits"] is False
    assert plan["max_sequences_at_context"] == 4
    assert plan["blocks_per_sequence"] == 256 and plan["bytes_per_block"] == 16 * 819_200


def test_llama3_8b_32_sequences_of_4k_take_16_gib():
    plan = plan_kv(**LLAMA3_8B, dtype="fp16", context=4096, batch=32)
    assert plan.bytes_per_token == 131_072
    assert plan.batch_bytes == 16 * GiB
    assert plan.fits is None and plan.kv_budget_bytes is None  # no VRAM, nothing to fit


def test_llama3_8b_from_config_json_with_estimated_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B_CONFIG))
    for where in (tmp_path, tmp_path / "config.json"):
        plan = plan_kv(where, dtype="bf16", context=4096, batch=32, vram_bytes="80GB")
        assert plan.bytes_per_token == 131_072
        assert plan.weights_source == "estimated"
        assert plan.weights_bytes == 8_030_261_248 * 2  # Llama-3-8B's parameters at bf16
        assert plan.kv_budget_bytes == int(80e9 * 0.9) - plan.weights_bytes
        assert plan.fits is True


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24GiB", 24 * GiB),
        ("7.5GB", 7_500_000_000),
        ("512MiB", 512 << 20),
        ("1.5TB", 1_500_000_000_000),
        ("1.5TiB", 3 << 39),
        ("8589934592", 8 * GiB),
        (" 2 kib ", 2048),
        ("100B", 100),
        (".5KB", 500),
        (4096, 4096),
    ],
)
def test_parse_bytes_decimal_and_binary_units(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("junk", ["", "abc", "24 GiBs", "1.2.3GB", "-5GB", "5G", "1e9", "GB"])
def test_parse_bytes_rejects_junk_naming_it(junk):
    with pytest.raises(ValueError, match="is not a byte count"):
        parse_bytes(junk)


def test_bad_vram_flag_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", *("--layers", "2", "--kv-heads", "2", "--head-dim", "8"), "--context",
              "16", "--vram", "lots"])  # fmt: skip
    assert exit_info.value.code == 2
    assert "argument --vram: 'lots' is not a byte count" in capsys.readouterr().err


def test_dtypes_by_any_name_and_fp8_is_one_byte():
    assert dtype_name(torch.float16) == "fp16" and dtype_name("bfloat16") == "bf16"
    assert dtype_name("float8_e4m3fn") == "fp8" and dtype_name("FP8") == "fp8"
    plan = plan_kv(**LLAMA3_8B, dtype="fp8", context=4096)
    assert plan.bytes_per_token == 65_536 and plan.dtype_bytes == 1
    with pytest.raises(ValueError, match="'int4'"):
        dtype_name("int4")


def test_weights_larger_than_the_card_leave_no_budget():
    plan = plan_kv(**LLAMA2_13B, context=16, vram_bytes="8GiB", weights_bytes="26GB")
    assert plan.kv_budget_bytes == 0 and plan.num_blocks == 0
    assert plan.budget_deficit_bytes == 26_000_000_000 - int(8 * GiB * 0.9)
    assert plan.fits is False and plan.max_sequences_at_context == 0


def test_partial_context_block_counts_whole_blocks():
    plan = plan_kv(**LLAMA3_8B, context=4097, batch=3, block_size=32, vram_bytes=40 * GiB)
    assert plan.blocks_per_sequence == 129 and plan.batch_blocks == 387
    assert plan.num_blocks == int(40 * GiB * 0.9) // (32 * 131_072)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_layers=2, context=8), "needs num_kv_heads, head_dim"),
        (dict(**LLAMA3_8B, context=0), "context must be a positive integer, got 0"),
        (dict(**LLAMA3_8B, context=8, block_size=-16), "block_size .* got -16"),
        (dict(**LLAMA3_8B, context=8, gpu_memory_utilization=1.5), r"\(0, 1\], got 1.5"),
        (dict(**LLAMA3_8B, context=8, vram_bytes=0), "vram .* got 0"),
    ],
)
def test_bad_arguments_name_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_kv(**kwargs)


def test_model_and_explicit_shape_together_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="not both"):
        plan_kv(tmp_path, **LLAMA3_8B, context=8)


def test_missing_model_names_the_path(tmp_path, capsys):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        plan_kv(missing, context=8)
    assert main(["plan", "--model", str(missing), "--context", "8"]) == 2
    assert str(missing) in capsys.readouterr().err


def test_gguf_header_config_matches_the_loader(tmp_path):
    path, _ = make_tiny_gguf("llama", tmp_path / "tiny.gguf", llama3_rope=True)
    config = gguf_config(read_gguf(path))
    assert config == load_gguf(path).config  # rope scaling, eos ids and all
    plan = plan_kv(path, dtype="fp32", context=100, block_size=8)
    assert plan.bytes_per_token == 2 * 2 * 2 * 32 * 4  # 2 layers, 2 KV heads, head_dim 32
    assert plan.blocks_per_sequence == 13 and plan.model == "tiny.gguf"


def test_hf_config_matches_the_loader_but_for_tokenizer_eos(tmp_path, default_model):
    folder = make_tiny_model("qwen3", tmp_path / "qwen3", tokenizer=default_model.tokenizer)
    loaded = load_hf_folder(folder).config
    for where in (folder, folder / "config.json"):
        config = model_config(where)
        assert config == replace(loaded, eos_token_ids=config.eos_token_ids)


def test_default_model_config_comes_from_the_header_alone(default_model):
    assert model_config(None) == default_model.config
    assert model_config("default") == default_model.config


@pytest.mark.parametrize(
    ("budget", "block_size", "kv_dtype"),
    [
        (64 << 20, 16, "float32"),
        ((100 << 20) + 12_345, 32, "float16"),
        (24 << 20, 8, "float32"),
        (48 << 20, 64, "bfloat16"),
        # fp8 (or any other cache dtype) once the engine offers it.
        *[(32 << 20, 16, d) for d in KV_DTYPES if d not in ("auto", *ENGINE_FLOAT_DTYPES)],
    ],
)
def test_predicted_pool_matches_the_engine(default_model, budget, block_size, kv_dtype):
    llm = LLM(
        model=default_model,
        device="cpu",
        dtype="float32",
        kv_cache_dtype=kv_dtype,
        block_size=block_size,
        kv_cache_memory=budget,
    )
    real = llm.stats()["kv_blocks_total"]
    predicted = predict_num_blocks(default_model.config, block_size, kv_dtype, budget)
    assert abs(predicted - real) <= 0.02 * real
    assert predict_num_blocks(None, block_size, kv_dtype, budget) == predicted


def test_weight_estimate_is_what_the_engine_holds(default_llm):
    mc = default_llm.engine.model_config
    assert estimate_weight_bytes(mc, "fp32") == default_llm.engine.model.weight_bytes()


def test_cli_plans_a_gguf_file_with_estimated_weights(tmp_path, capsys):
    path, _ = make_tiny_gguf("qwen2", tmp_path / "q.gguf")
    plan = _plan_json(capsys, "--model", str(path), "--context", "64", "--vram", "1MiB")
    mc = model_config(path)
    assert plan["weights_source"] == "estimated" and plan["weights_dtype"] == "fp16"
    assert plan["weights_bytes"] == estimate_weight_bytes(mc, "fp16")
    assert plan["num_blocks"] == predict_num_blocks(path, 16, "fp16", plan["kv_budget_bytes"])


def test_cli_table_is_readable(capsys):
    argv = ["plan", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--context", "4096"]
    assert main([*argv, "--batch", "32", "--vram", "24GiB", "--weights", "16GB"]) == 0
    out = capsys.readouterr().out
    assert "bytes per token" in out and "131,072 B" in out
    assert "17,179,869,184 B (17.18 GB, 16.00 GiB)" in out
    assert "fits" in out and "NO" in out
