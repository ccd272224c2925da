"""Before loading: what a model's weights will cost under an EngineConfig, and whether they fit.

The app's settings dialog shows these figures while the user picks a model. They come from the
same weight plan the engine's own fit check uses (engine.sizing.model_build.check_fits), so the
dialog and the engine cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from kvscope.engine.config import DEFAULT_CPU_KV_MEMORY, EngineConfig
from kvscope.engine.model.loaded_model import expected_weight_shapes
from kvscope.engine.model.model_config import ModelConfig
from kvscope.engine.sizing.float32_weights import float32_choice
from kvscope.engine.sizing.model_build import free_memory
from kvscope.engine.sizing.weight_plan import (
    RUNTIME_OVERHEAD,
    WeightPlan,
    plan_weights,
    weights_quantized,
)

__all__ = ["count_parameters", "resolve_for_weights", "weight_fit", "WeightFit", "WeightsHeader"]

# Tensor shapes and stored kinds (engine.sizing.planner.weights_header), read-only.
WeightsHeader = tuple[Mapping[str, tuple[int, ...]], Mapping[str, str]]


@dataclass(frozen=True)
class WeightFit:
    plan: WeightPlan
    free_bytes: int | None  # on the config's device; None where it cannot be read
    note: str = ""  # how float32 compute keeps quantized weights (engine.sizing.float32_weights)
    # What check_fits adds to the weights: the KV pool and, on a CPU, the runtime itself.
    kv_bytes: int = 0
    overhead_bytes: int = 0
    usable_share: float = 1.0  # of free_bytes the engine may take (gpu_memory_utilization)

    @property
    def need_bytes(self) -> int:
        """What engine.sizing.model_build.check_fits compares with the free memory."""
        return self.plan.total_bytes + self.kv_bytes + self.overhead_bytes

    @property
    def usable_bytes(self) -> int | None:
        return None if self.free_bytes is None else int(self.free_bytes * self.usable_share)

    @property
    def fits(self) -> bool:
        usable = self.usable_bytes
        return usable is None or self.need_bytes <= usable


def count_parameters(mc: ModelConfig) -> int:
    return sum(math.prod(shape) for shape in expected_weight_shapes(mc).values())


def resolve_for_weights(config: EngineConfig, header: WeightsHeader | None) -> EngineConfig:
    """`config` as the engine will see it for these weights: dtype "auto" depends on whether
    any weight stays quantized."""
    if header is None:
        return config
    return replace(config, weights_quantized=weights_quantized(header[1], config.quantization))


def weight_fit(config: EngineConfig, header: WeightsHeader, tied: bool) -> WeightFit:
    shapes, kinds = header
    device = config.torch_device
    free = free_memory(device)
    # The KV pool as the settings ask for it (a block count's bytes are known only at load).
    kv = config.kv_cache_memory or (DEFAULT_CPU_KV_MEMORY if device.type == "cpu" else 0)
    choice = float32_choice(config, shapes, kinds, tied, kv, free)
    plan = plan_weights(shapes, kinds, choice.quantization, device, config.torch_dtype, tied)
    on_cpu = device.type == "cpu"
    share = 1.0 if on_cpu else config.gpu_memory_utilization
    return WeightFit(plan, free, choice.note, kv, RUNTIME_OVERHEAD if on_cpu else 0, share)
