"""Build the model from a LoadedModel, refusing up front what will not fit in memory.

The fit check runs before a single weight is read: the weights' runtime size and load peak
come from the header (`engine.sizing.weight_plan`), free memory from the OS (host RAM: MemAvailable)
or the CUDA driver. A MemoryError or CUDA out-of-memory that still happens while building (a
machine whose free memory shrank meanwhile) becomes the same clear error, never a traceback.
"""

from __future__ import annotations

import gc
from pathlib import Path

import torch

from kvscope.engine.config import DEFAULT_CPU_KV_MEMORY, EngineConfig
from kvscope.engine.memory.device_memory import system_memory
from kvscope.engine.memory.host_memory import lean_allocations
from kvscope.engine.memory.model_too_large import ModelTooLargeError
from kvscope.engine.model.gemma3 import Gemma3Model
from kvscope.engine.model.llama import LlamaModel
from kvscope.engine.model.loader import LoadedModel
from kvscope.engine.quant.cpu_layout import kernel_choice
from kvscope.engine.sizing.kv_pool import bytes_per_block
from kvscope.engine.sizing.weight_plan import (
    RUNTIME_OVERHEAD,
    WAYS_OUT,
    WeightPlan,
    describe_need,
    plan_weights,
)


def weight_plan_for(config: EngineConfig, loaded: LoadedModel) -> WeightPlan:
    return plan_weights(
        loaded.weights.shapes(),
        loaded.weights.kinds(),
        config.quantization,
        config.torch_device,
        config.torch_dtype,
        loaded.config.tie_word_embeddings,
    )


def kv_pool_bytes(config: EngineConfig, loaded: LoadedModel) -> int:
    """The KV pool the engine will allocate, where it is known before the model is built."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks * bytes_per_block(config, loaded.config)
    if config.kv_cache_memory is not None:
        return config.kv_cache_memory
    return DEFAULT_CPU_KV_MEMORY if config.torch_device.type == "cpu" else 0


def free_memory(device: torch.device) -> int | None:
    """Bytes free for this process on `device`: MemAvailable, or the CUDA driver's free."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return system_memory()[1]


def check_fits(config: EngineConfig, loaded: LoadedModel) -> WeightPlan:
    plan = weight_plan_for(config, loaded)
    device = config.torch_device
    kv = kv_pool_bytes(config, loaded)
    free = free_memory(device)
    need = plan.total_bytes + kv + (RUNTIME_OVERHEAD if device.type == "cpu" else 0)
    if device.type == "cuda" and free is not None:
        free = int(free * config.gpu_memory_utilization)
    if free is not None and need > free:
        label = Path(loaded.source).name
        raise ModelTooLargeError(f"{describe_need(label, plan, kv, device, free)}. {WAYS_OUT}")
    return plan


def build_model(config: EngineConfig, loaded: LoadedModel, max_position: int) -> LlamaModel:
    with kernel_choice(config.cpu_quant_kernel):  # the weight plan and the layouts follow it
        return _build_model(config, loaded, max_position)


def _build_model(config: EngineConfig, loaded: LoadedModel, max_position: int) -> LlamaModel:
    plan = check_fits(config, loaded)
    device = config.torch_device
    try:
        with lean_allocations():
            model_class = Gemma3Model if loaded.config.architecture == "gemma3" else LlamaModel
            return model_class(
                loaded.config,
                loaded.weights,
                config.torch_dtype,
                device,
                max_position,
                config.quantization,
            )
    except (MemoryError, torch.OutOfMemoryError) as e:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        label = Path(loaded.source).name
        free = free_memory(device)
        raise ModelTooLargeError(
            f"ran out of memory while loading: {describe_need(label, plan, 0, device, free)}. "
            f"{WAYS_OUT}"
        ) from e
