"""The planner's block and pool sentences parsed back and every figure checked: shared by the
sentence tests and the settings dialog's."""

from __future__ import annotations

import math
import re

from kvscope.engine.model.model_config import ModelConfig
from kvscope.engine.sizing import planner

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def _n(text: str) -> int:
    return int(text.replace(",", ""))


def check_sentences(text: str, mc: ModelConfig, kv_dtype: str, budget_bytes: int, context: int):
    """Parse the block and pool sentences in `text` and check every figure they state; returns
    (blocks, blocks per context)."""
    block = re.search(
        r"a block is (\d+) tokens of (?:all (\d+) layers|(\d+) of the (\d+) layers "
        r"\(one of (\d+) KV groups\)), ([\d,]+) B",
        text,
    )
    assert block, text
    bs = int(block[1])
    layers_per_block = int(block[2] or block[3])
    assert int(block[2] or block[4]) == mc.num_layers
    per_block = bs * 2 * layers_per_block * mc.num_kv_heads * mc.head_dim * DTYPE_BYTES[kv_dtype]
    assert _n(block[6]) == per_block, text
    head = re.search(r"([\d,]+) MiB holds ([\d,]+) blocks of (\d+)", text)
    assert head and _n(head[1]) << 20 == budget_bytes and int(head[3]) == bs, text
    blocks = _n(head[2])
    assert blocks == budget_bytes // per_block, text
    context_blocks = math.ceil(context / bs)
    single = re.search(r"blocks of \d+ = ([\d,]+) tokens", text)
    if single:  # one KV group: a block holds every layer, blocks x size = tokens
        assert block[2], "one group's block holds all layers"
        assert _n(single[1]) == blocks * bs, text
        each = re.search(
            r"([\d.]+) full contexts of ([\d,]+) tokens, ([\d,]+) blocks each", text
        ) or re.search(r"context holds ⌈([\d,]+)/(\d+)⌉ \+ 1 = ([\d,]+) blocks", text)
        assert each, text
        if "⌈" in each[0]:  # the window is shorter than the context: it says so
            window = _n(each[1])
            assert f"{window:,}-token window" in text and window == mc.sliding_window
            per_context = _n(each[3])
            assert per_context == math.ceil(window / bs) + 1 < context_blocks
            contexts = re.search(r"holds ([\d.]+) full contexts \(([\d,]+) / ([\d,]+)\)", text)
            assert contexts and (_n(contexts[2]), _n(contexts[3])) == (blocks, per_context)
            assert float(contexts[1]) == round(blocks / per_context, 1)
        else:
            per_context = _n(each[3])
            assert _n(each[2]) == context and per_context == context_blocks, text
            assert float(each[1]) == round(blocks / per_context, 1), text
            if context % bs == 0:  # then tokens / context says the same
                assert float(each[1]) == round(blocks * bs / context, 1), text
    else:  # several groups: the blocks one context takes, group by group
        assert block[3], "a hybrid model's block holds one group's layers"
        num_groups = int(block[5])
        terms = re.search(r"an? ([\d,]+)-token context holds (.*?) = ([\d,]+) blocks", text)
        assert terms and _n(terms[1]) == context, text
        parts = re.findall(r"([\d,]+) × (\d+) (full-attention|sliding) groups?", terms[2])
        assert " + ".join(f"{a} × {b} {c} group" for a, b, c in parts) in terms[2].replace(
            "groups", "group"
        )
        per_context = sum(_n(each) * int(n) for each, n, _ in parts)
        assert per_context == _n(terms[3]), text
        assert sum(int(n) for _, n, _ in parts) == num_groups
        window = mc.sliding_window
        for each, _, kind in parts:
            expected = context_blocks
            if kind == "sliding":
                expected = min(context_blocks, math.ceil(window / bs) + 1)
            assert _n(each) == expected, (kind, text)
        if math.ceil(window / bs) + 1 < context_blocks:
            assert f"⌈{window:,}/{bs}⌉ + 1 = {math.ceil(window / bs) + 1:,} blocks" in text
        else:
            assert "window is no shorter than the context" in text
        contexts = re.search(r"holds ([\d.]+) full contexts \(([\d,]+) / ([\d,]+)\)", text)
        assert contexts and (_n(contexts[2]), _n(contexts[3])) == (blocks, per_context), text
        assert float(contexts[1]) == round(blocks / per_context, 1), text
        assert "= " + f"{blocks // num_groups * bs:,} tokens" not in text  # the filed figure
    # The engine's own layout counts a context the same way.
    assert per_context == planner.blocks_per_context(mc, bs, context)
    return blocks, per_context
