"""What would make an engine build fail, found from headers before the settings dialog applies.

A rebuild takes seconds to minutes, frees the running engine first and, when it fails, says so
in a dialog after the fact. Every failure the settings can cause and the headers can predict is
checked here instead, each with a sentence naming the value and the limit: a knob EngineConfig
refuses, a max model length past the model's context (LLMEngine refuses it after loading), a KV
budget under one block (memory_profile.size_kv_pool), a pool that holds no sequence, weights
that do not fit the memory free (engine.sizing.model_build.check_fits, through
engine.sizing.weight_fit's figures). The settings dialog shows the first problem and does not apply.
"""

from __future__ import annotations

import math

from kvscope.app.core.settings import EngineSettings
from kvscope.engine.model.model_config import ModelConfig
from kvscope.engine.sizing import planner
from kvscope.engine.sizing.weight_fit import WeightsHeader, resolve_for_weights, weight_fit

GiB = float(1 << 30)


def context_limit(mc: ModelConfig) -> int:
    """The longest max model length this model takes: its own context length."""
    return mc.max_position_embeddings


def build_problems(
    settings: EngineSettings,
    mc: ModelConfig | None,
    header: WeightsHeader | None,
    freed_bytes: int = 0,
) -> list[str]:
    """Sentences, one per problem, for `settings` over a model with this config and weights
    header ([] when the build should go through). `freed_bytes`: what the running engine gives
    back before the new one loads (its weights and KV pool)."""
    try:
        config = settings.engine_config()
    except ValueError as e:
        return [str(e)]
    if mc is None:
        return []  # the picker says why it could not read the model
    problems = []
    limit = context_limit(mc)
    if settings.max_model_len is not None and settings.max_model_len > limit:
        problems.append(
            f"Max model length {settings.max_model_len:,} is over this model's context length "
            f"{limit:,}: choose {limit:,} or less."
        )
    config = resolve_for_weights(config, header)
    kv_dtype = planner.dtype_name(config.kv_torch_dtype)
    layout = planner.kv_layout_of(mc, config.block_size)
    per_block = config.block_size * planner.bytes_per_token(
        layout.group_size, mc.num_kv_heads, mc.head_dim, kv_dtype
    )
    if config.torch_device.type == "cpu":
        budget = settings.kv_budget_mib << 20
        blocks = budget // per_block
        if blocks < 1:
            problems.append(
                f"A KV budget of {settings.kv_budget_mib:,} MiB is smaller than one block of "
                f"{config.block_size} tokens ({per_block:,} B for this model at {kv_dtype}): "
                f"raise it to {math.ceil(per_block / (1 << 20)):,} MiB or choose a smaller "
                "block size."
            )
        else:
            context = min(settings.max_model_len or limit, limit)
            longest = layout.max_tokens_for_blocks(blocks, config.batched_tokens_limit, context)
            if longest < 2:  # the engine's shortest max_model_len: a token and its reply
                needed = layout.max_blocks_held(2, 2)
                problems.append(
                    f"A KV budget of {settings.kv_budget_mib:,} MiB holds {blocks:,} blocks, "
                    f"fewer than the {needed:,} one sequence needs (a block in each of "
                    f"{layout.num_groups} KV groups): raise the budget."
                )
    if header is not None:
        fit = weight_fit(config, header, mc.tie_word_embeddings)
        usable = fit.usable_bytes
        if usable is not None and fit.need_bytes > usable + freed_bytes:
            where = "RAM" if config.torch_device.type == "cpu" else "GPU memory"
            after = f" (with {freed_bytes / GiB:.2f} GiB the running engine gives back)"
            problems.append(
                f"This model needs {fit.need_bytes / GiB:.2f} GiB of {where} to load "
                f"({fit.plan.runtime_bytes / GiB:.2f} GiB of weights as "
                f"{'+'.join(fit.plan.formats)}, {fit.plan.load_peak_bytes / GiB:.2f} GiB while "
                f"converting, the KV pool and the runtime), but "
                f"{(usable + freed_bytes) / GiB:.2f} GiB is free{after if freed_bytes else ''}:"
                " keep the file's quantization (auto), lower the KV budget, or close programs."
            )
    return problems
