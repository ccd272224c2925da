"""The app, `kvscope serve`, `record` and `bench` run a model with one context and one pool, so a
recording made on the command line is the app's run."""

from __future__ import annotations

import pytest

from kvscope.app.cli.main import build_parser
from kvscope.app.core.defaults import (
    DEFAULT_CPU_KV_MIB,
    DEFAULT_MAX_MODEL_LEN,
    default_max_model_len,
)
from kvscope.app.core.engine_flags import llm_from_args
from kvscope.app.core.settings import EngineSettings
from kvscope.engine import LLM
from kvscope.engine.config import EngineConfig
from kvscope.engine.model.loader import load_model


@pytest.fixture(scope="module")
def bundled():
    return load_model(None)


def test_the_cli_and_the_app_build_the_same_pool_and_context(bundled):
    app = LLM(model=bundled, **EngineSettings(device="cpu").llm_kwargs())
    args = build_parser().parse_args(["record", "out.kvev", "--device", "cpu"])
    args.model = bundled.source
    cli = llm_from_args(args)
    context = default_max_model_len(bundled.config.max_position_embeddings)
    assert app.engine.max_model_len == cli.engine.max_model_len == context == 4096
    assert app.stats()["kv_blocks_total"] == cli.stats()["kv_blocks_total"]
    # The engine as a library keeps vLLM's default: the model's own context.
    assert EngineConfig().max_model_len is None
    assert DEFAULT_CPU_KV_MIB << 20 == app.config.kv_cache_memory


def test_a_short_context_model_keeps_its_own_length():
    assert default_max_model_len(2048) == 2048
    assert default_max_model_len(131_072) == DEFAULT_MAX_MODEL_LEN


@pytest.mark.parametrize("command", ["serve", "record", "generate", "chat"])
def test_help_names_the_product_default(command, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    assert f"default: {DEFAULT_MAX_MODEL_LEN:,}" in " ".join(capsys.readouterr().out.split())
