"""The planner's sentences add up: their numbers are parsed back and checked, per KV layout.

Filed for Gemma 3: "256 MiB holds 5,461 blocks of 16 = 14,560 tokens (18.6 full contexts of
2,048)", where 5,461 x 16 is 87,376 and 14,560 / 2,048 is 7.1. Each layout kind (full attention,
GQA variants, fp8 KV, all-sliding, hybrid sliding + full) goes through the same parser, which
knows nothing of how the sentence was made: only the model's shape and the arithmetic.
"""

from __future__ import annotations

import pytest
from pool_sentences import check_sentences  # noqa: F401

from kvscope.app.desktop.blockmap.pool_fit import naive_sequences
from kvscope.app.desktop.blockmap.pool_sentence import block_sentence, pool_figures, pool_sentence
from kvscope.engine.model.model_config import FULL, SLIDING, ModelConfig
from kvscope.engine.sizing import planner


def model(layers, kv_heads, head_dim, *, window=None, every=None, context=32768) -> ModelConfig:
    """A model's KV shape; `every`: one full layer in that many (Gemma 3's 6), else all alike."""
    types = ()
    if window is not None and every is not None:
        types = tuple(FULL if i % every == every - 1 else SLIDING for i in range(layers))
    return ModelConfig(
        "gemma3" if every else "mistral" if window else "llama",
        1000,
        64,
        128,
        layers,
        max(kv_heads, 4),
        kv_heads,
        head_dim,
        1e-6,
        1e4,
        context,
        True,
        sliding_window=window,
        layer_types=types,
    )


LAYOUTS = {
    # name: (model, kv dtype, budget MiB, block size, context)
    "full attention, bundled SmolLM2 shape": (model(30, 3, 64), "bf16", 64, 16, 2048),
    "full attention, context not a multiple of the block": (model(30, 3, 64), "fp32", 64, 16, 2050),
    "GQA 8 KV heads (Llama 3 8B)": (model(32, 8, 128), "fp16", 512, 32, 8192),
    "GQA 4 KV heads (TinyLlama)": (model(22, 4, 64), "bf16", 256, 16, 2048),
    "multi-query, 1 KV head": (model(18, 1, 256), "bf16", 100, 64, 1000),
    "fp8 KV": (model(32, 8, 128), "fp8", 512, 16, 4096),
    "all sliding, window shorter (Mistral)": (
        model(32, 8, 128, window=4096),
        "bf16",
        1024,
        16,
        32768,
    ),
    "all sliding, window longer": (model(32, 8, 128, window=4096), "bf16", 1024, 16, 2048),
    "hybrid 5:1 (Gemma 3 270M)": (model(18, 1, 256, window=512, every=6), "bf16", 256, 16, 2048),
    "hybrid, uneven groups (Gemma 3 1B)": (
        model(26, 1, 256, window=512, every=6),
        "bf16",
        256,
        16,
        32768,
    ),
    "hybrid with fp8 KV": (model(18, 1, 256, window=512, every=6), "fp8", 64, 32, 8192),
    "hybrid, window over the context": (
        model(18, 1, 256, window=512, every=6),
        "bf16",
        64,
        16,
        300,
    ),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_pool_sentence_adds_up(name):
    mc, kv_dtype, mib, bs, context = LAYOUTS[name]
    blocks = planner.predict_num_blocks(mc, bs, kv_dtype, mib << 20)
    figures = pool_figures(mc, bs, kv_dtype, blocks, context)
    text = f"{block_sentence(figures)}. {pool_sentence(figures, f'{mib} MiB')}"
    check_sentences(text, mc, kv_dtype, mib << 20, context)


def test_gemma3_270m_reads_as_filed_but_adds_up():
    """The filed case: 5,461 blocks at 256 MiB, 293 of them per 2,048-token context."""
    mc, kv_dtype, mib, bs, context = LAYOUTS["hybrid 5:1 (Gemma 3 270M)"]
    blocks = planner.predict_num_blocks(mc, bs, kv_dtype, mib << 20)
    text = pool_sentence(pool_figures(mc, bs, kv_dtype, blocks, context), "256 MiB")
    assert blocks == 5461
    assert "128 × 1 full-attention group + 33 × 5 sliding groups = 293 blocks" in text
    assert "18.6 full contexts (5,461 / 293)" in text
    assert "14,560" not in text


def test_the_naive_line_reserves_every_group():
    """The naive scheme reserves the whole length in each of Gemma's 6 groups (as the shadow
    places it), so it fits 7 sequences of 2,048 in 5,461 blocks, not 42."""
    assert naive_sequences(5461, 16, 2048, num_groups=6) == 5461 // (128 * 6) == 7
    assert naive_sequences(5461, 16, 2048) == 42  # one group: as before
