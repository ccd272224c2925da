"""float32 compute over a GGUF's quantized weights: dequantize once, not on every call.

On a CPU, quantized weights run fast only in bfloat16 (engine/quant/cpu_layout.py); in float32
the packed format is dequantized a few rows at a time on every matmul, exact but slow: on the
bundled model, 32 chat requests ran at 34 useful tok/s that way against 114 with the weights
dequantized once at load (`quantization="none"`). So with `quantization="auto"` and float32
compute, the engine dequantizes at load whenever the dense float32 weights fit the memory the
fit check allows (the same plan and budget as engine/model_build.check_fits), and keeps the
per-call path only when they do not, saying so (`WeightChoice.note`, shown by the app next to
the weights line and by `stats()["weight_choice"]`).

Both paths compute with the same float32 weights (a Q4_K block dequantizes to the same numbers
either way), so the choice changes speed and memory, never the tokens."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from kvscope.engine.config import EngineConfig
from kvscope.engine.sizing.weight_plan import RUNTIME_OVERHEAD, plan_weights, weights_quantized


@dataclass(frozen=True)
class WeightChoice:
    quantization: str  # what the model is built with: "none" when dequantized at load
    note: str  # "" when there was nothing to choose


def float32_choice(
    config: EngineConfig,
    shapes: Mapping[str, tuple[int, ...]],
    kinds: Mapping[str, str],
    tied: bool,
    kv_bytes: int,
    free_bytes: int | None,
) -> WeightChoice:
    """How a CPU float32 engine keeps a quantized file's weights (see the module docstring)."""
    device = config.torch_device
    if (
        config.quantization != "auto"
        or device.type != "cpu"
        or config.torch_dtype != torch.float32
        or not weights_quantized(kinds, "auto")
    ):
        return WeightChoice(config.quantization, "")
    dense = plan_weights(shapes, kinds, "none", device, torch.float32, tied)
    need = dense.total_bytes + kv_bytes + RUNTIME_OVERHEAD
    if free_bytes is None or need <= free_bytes:
        return WeightChoice("none", "float32: the quantized weights dequantized once at load")
    return WeightChoice(
        "auto",
        f"float32: dequantized on every call, ~3x slower: dense float32 weights need "
        f"{_gib(need)} with the KV pool, {_gib(free_bytes)} is free "
        "(bfloat16 runs the quantized weights at full speed)",
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
