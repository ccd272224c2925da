"""How many KV blocks the pool gets: explicit count, a byte budget, or what the GPU has left."""

from __future__ import annotations

import torch

from kvscope.engine.config import DEFAULT_CPU_KV_MEMORY, EngineConfig
from kvscope.engine.kv.kv_cache import KVCache
from kvscope.engine.kv.layout import KVLayout
from kvscope.engine.model.attention import AttentionMetadata
from kvscope.engine.model.llama import LlamaModel
from kvscope.engine.model.model_config import ModelConfig


def kv_layout(config: EngineConfig, mc: ModelConfig) -> KVLayout:
    """How the pool holds this model's layers: groups by window when the paged allocator
    releases window blocks, one group otherwise (the naive allocator never releases)."""
    release = config.allocator == "paged" and config.release_window_blocks
    return KVLayout.for_windows(mc.layer_windows(), config.block_size, honour_windows=release)


def bytes_per_block(config: EngineConfig, mc: ModelConfig) -> int:
    return KVCache.bytes_per_block(
        kv_layout(config, mc).group_size,
        config.block_size,
        mc.num_kv_heads,
        mc.head_dim,
        config.kv_torch_dtype,
    )


def size_kv_pool(config: EngineConfig, mc: ModelConfig, model: LlamaModel) -> int:
    per_block = bytes_per_block(config, mc)
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    if config.kv_cache_memory is not None:
        budget = config.kv_cache_memory
    elif config.torch_device.type == "cuda":
        budget = _cuda_kv_budget(config, model)
    else:
        budget = DEFAULT_CPU_KV_MEMORY
    blocks = budget // per_block
    if blocks < 1:
        raise ValueError(
            f"KV budget of {budget} bytes is smaller than one block ({per_block} bytes)"
        )
    return int(blocks)


def _cuda_kv_budget(config: EngineConfig, model: LlamaModel) -> int:
    """gpu_memory_utilization x total, minus the peak of a real full-size step and the weights."""
    device = config.torch_device
    mc = model.cfg
    num_tokens = min(config.batched_tokens_limit, model.rope.max_position)
    bs = config.block_size
    num_blocks = -(-num_tokens // bs)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    # A throwaway pool just big enough for one maximal prefill chunk; its bytes count as
    # activations, which errs on the safe side.
    scratch = KVCache(
        mc.num_layers, num_blocks, bs, mc.num_kv_heads, mc.head_dim, config.kv_torch_dtype, device
    )
    meta = AttentionMetadata.single_prefill(num_tokens, bs, device)
    ids = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    hidden = model.forward(ids, torch.arange(num_tokens, device=device), scratch, meta)
    rows = hidden[:1].expand(min(config.max_num_seqs, num_tokens), -1)
    logits = model.compute_logits(rows)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del scratch, hidden, logits
    torch.cuda.empty_cache()
    _, total = torch.cuda.mem_get_info(device)
    budget = int(total * config.gpu_memory_utilization) - peak
    if budget <= 0:
        raise ValueError(
            f"gpu_memory_utilization {config.gpu_memory_utilization} leaves no room for the KV "
            f"cache: weights and one step's activations need {peak} of {total} bytes"
        )
    return budget
