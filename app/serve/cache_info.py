"""`vllm:cache_config_info`: vLLM's info gauge of its CacheConfig (value 1, the facts as labels).

vLLM 0.33 renders it from `CacheConfig.metrics_info()`, `str()` of every field of the config
(private ones included), plus `engine`. CACHE_CONFIG_INFO is that label set, in vLLM's order, each
with the value a default vLLM server publishes; `cache_config_info` puts our engine's settings in
the labels that have a counterpart here, and leaves vLLM's defaults in the others (mamba, offload,
KV connector, layout knobs we do not have). tests/app/remote/test_vllm_metrics.py checks the label
set against vLLM's own CacheConfig.

Where ours differ in kind: `cache_dtype` is our KV dtype knob, whose names are vLLM's ("auto",
"float16", "bfloat16", "fp8", which is e4m3 in both) plus "float32", which vLLM has not: it is
published as "auto" when the model runs in float32 too (vLLM's "auto": the model's dtype), as
"float32" otherwise (a KV dtype vLLM cannot state). `user_specified_block_size` stays "False"
(vLLM's True means the block size came from its command line; our engine cannot tell its
default from a choice). `kv_cache_size_tokens` / `kv_cache_max_concurrency` are filled for a
model whose layers all attend fully (one KV group), as vLLM computes them for one full-attention
group, and left "None" for sliding-window models, whose group-aware capacity we do not compute
the way vLLM does. The cache config test also checks the values: vLLM's CacheConfig, given our
settings, renders exactly ours."""

from __future__ import annotations

import math

from kvscope.engine import EngineConfig, LLMEngine

# (label, what a default vLLM 0.33 server publishes) in CacheConfig's field order, then "engine".
CACHE_CONFIG_INFO: tuple[tuple[str, str], ...] = (
    ("block_size", "16"),
    ("user_specified_block_size", "False"),
    ("kv_cache_layout", "None"),
    ("prefix_match_unit", "None"),
    ("gpu_memory_utilization", "0.92"),
    ("cache_dtype", "auto"),
    ("is_attention_free", "False"),
    ("num_gpu_blocks_override", "None"),
    ("sliding_window", "None"),
    ("enable_prefix_caching", "True"),
    ("prefix_caching_hash_algo", "sha256"),
    ("prefix_cache_retention_interval", "0"),
    ("kv_cache_dtype_skip_layers", "[]"),
    ("mamba_page_size_padded", "None"),
    ("skip_page_size_padded", "None"),
    ("mamba_block_size", "None"),
    ("mamba_cache_dtype", "auto"),
    ("mamba_ssm_cache_dtype", "auto"),
    ("mamba_cache_mode", "none"),
    ("enable_mamba_shared_prefix_checkpoint", "False"),
    ("replayssm_buffer_len", "16"),
    ("use_replayssm", "False"),
    ("use_kda_recoverssm", "False"),
    ("num_gpu_blocks", "None"),
    ("num_cpu_blocks", "None"),
    ("simple_cpu_offload_num_blocks", "None"),
    ("effective_attention_block_size", "None"),
    ("kv_cache_size_tokens", "None"),
    ("kv_cache_max_concurrency", "None"),
    ("hash_block_size", "None"),
    ("cache_hit_alignment_tokens", "None"),
    ("kv_sharing_fast_prefill", "False"),
    ("swa_bounded_replay", "True"),
    ("kv_cache_memory_bytes", "None"),
    ("kv_offloading_size", "None"),
    ("kv_offloading_backend", "native"),
    ("_block_size_resolved", "True"),
    ("engine", "0"),
)
CACHE_CONFIG_LABELS = tuple(label for label, _ in CACHE_CONFIG_INFO)


def cache_config_info(engine: LLMEngine, hash_algo: str) -> dict[str, str]:
    """The labels of `vllm:cache_config_info` for this engine, values as vLLM renders them
    (`str()` of the Python value: "True", "None", "16")."""
    c = engine.config
    info = dict(CACHE_CONFIG_INFO)
    stats = engine.stats()
    num_blocks = stats["kv_blocks_total"]
    windows = engine.model_config.layer_windows()
    sliding = [w for w in windows if w is not None]
    info.update(
        block_size=str(c.block_size),
        gpu_memory_utilization=str(c.gpu_memory_utilization),
        cache_dtype=_cache_dtype(c),
        # vLLM's override of the profiled pool size; ours is the pool size asked for.
        num_gpu_blocks_override=str(c.num_kv_blocks),
        # vLLM copies the model's `sliding_window`; a model has one (Gemma 3's local layers).
        sliding_window=str(max(sliding)) if sliding else "None",
        # The naive contiguous allocator shares nothing, so it has no prefix cache.
        enable_prefix_caching=str(bool(c.enable_prefix_caching) and c.allocator == "paged"),
        prefix_caching_hash_algo=hash_algo,
        num_gpu_blocks=str(num_blocks),
        effective_attention_block_size=str(c.block_size) if None in windows else "None",
        kv_cache_memory_bytes=str(c.kv_cache_memory),
    )
    if stats["kv_group_windows"] == [None]:
        # vLLM's get_kv_cache_capacity for one full-attention group: a request at
        # max_model_len holds cdiv(max_model_len, block_size) blocks.
        concurrency = num_blocks / math.ceil(engine.max_model_len / c.block_size)
        info["kv_cache_max_concurrency"] = str(concurrency)
        info["kv_cache_size_tokens"] = str(int(concurrency * engine.max_model_len))
    return info


def _cache_dtype(c: EngineConfig) -> str:
    if c.kv_cache_dtype == "float32" and c.torch_dtype == c.kv_torch_dtype:
        return "auto"
    return c.kv_cache_dtype
