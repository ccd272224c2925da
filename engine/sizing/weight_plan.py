"""What a model's weights will take in memory, from tensor shapes and types alone.

The engine asks this before it reads a byte of weights (`check_fits`), and the planner shows
it: each tensor counted in the form it will really have at run time (`engine.model.linear`):
the packed format of `kernels.quant_format`, torch's CPU int4 layout, or dense in the compute
dtype. The load peak on top is what the streaming build holds while converting: the largest
tensor (or fused group) in both its read and its runtime form, the next tensor read ahead, and
conversion scratch. `kvscope bench --models` compares the sum with the measured peak RSS.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from kvscope.engine.memory.byte_units import format_bytes
from kvscope.engine.quant.cpu_layout import (
    INT4_GROUP_SIZES,
    TILE_N,
    gemv_wanted,
    int4_kernel_available,
)
from kvscope.kernels import cpu_gemv

# Per GGUF type: (bits of a code, group, super-group, sub-scales per group: 0, 1 shared, 2)
PACKED_LAYOUTS = {
    "Q4_0": (4, 32, 32, 0),
    "Q4_1": (4, 32, 32, 0),
    "Q5_0": (8, 32, 32, 0),
    "Q5_1": (8, 32, 32, 0),
    "Q8_0": (8, 32, 32, 0),
    "Q4_K": (4, 32, 256, 2),
    "Q5_K": (8, 32, 256, 2),
    "Q6_K": (8, 16, 256, 1),
}
DENSE_KINDS = {"F32": 4, "F16": 2, "BF16": 2, "float32": 4, "float16": 2, "bfloat16": 2}
RTN_GROUP = 128
CONVERSION_SCRATCH = 128 << 20  # numpy/torch scratch of a few conversion chunks
# Python, torch and the tokenizer before any weight: measured 380-450 MB RSS on this machine.
RUNTIME_OVERHEAD = 600 << 20


@dataclass(frozen=True)
class WeightPlan:
    runtime_bytes: int  # the weights once built
    load_peak_bytes: int  # extra held while building
    formats: tuple[str, ...]  # the stored kinds of the matmul weights
    layout: str  # "packed" | "cpu-int4" | "dense"

    @property
    def total_bytes(self) -> int:
        return self.runtime_bytes + self.load_peak_bytes


def layout_for(device: torch.device, dtype: torch.dtype, quantized: bool) -> str:
    if not quantized:
        return "dense"
    if device.type == "cpu" and dtype == torch.bfloat16:
        return "cpu-int4"
    return "packed"


def tensor_bytes(
    shape: tuple[int, ...], kind: str, quantization: str, layout: str, dtype_bytes: int, name: str
) -> int:
    """Runtime bytes of one tensor (see the module docstring)."""
    n_el = math.prod(shape)
    matrix = len(shape) == 2 and "norm" not in name
    if kind in PACKED_LAYOUTS and quantization != "none":
        bits, group, sup, subs = PACKED_LAYOUTS[kind]
    elif matrix and quantization in ("int8", "int4") and shape[1] % 32 == 0:
        group = next(g for g in (RTN_GROUP, 64, 32) if shape[1] % g == 0)
        bits, sup, subs = (8 if quantization == "int8" else 4), group, 0
    else:
        return n_el * dtype_bytes
    n, k = shape
    if layout == "cpu-int4" and gemv_wanted():  # numba's layout (kernels/cpu_gemv.py)
        return cpu_gemv.layout_bytes(n, k, bits, group, kind)
    if layout == "cpu-int4":
        if group not in INT4_GROUP_SIZES or not int4_kernel_available():
            return n_el * 2  # bf16 dense (Q6_K, or no int4 kernel on this CPU)
        n_padded = -(-n // TILE_N) * TILE_N
        one = n_padded * (k // 2) + n_padded * (k // group) * 4
        return one * (1 if bits == 4 else 2)
    codes = n * k * bits // 8
    scales = n * (k // sup) * 2 * 2  # d and dmin, float16
    return codes + scales + n * (k // group) * subs


def plan_weights(
    shapes: Mapping[str, tuple[int, ...]],
    kinds: Mapping[str, str],
    quantization: str,
    device: torch.device,
    dtype: torch.dtype,
    tied: bool,
) -> WeightPlan:
    quantized = weights_quantized(kinds, quantization)
    layout = layout_for(device, dtype, quantized)
    dtype_bytes = torch.empty((), dtype=dtype).element_size()
    per_tensor = {
        name: tensor_bytes(shape, kinds.get(name, ""), quantization, layout, dtype_bytes, name)
        for name, shape in shapes.items()
    }
    total = sum(per_tensor.values())
    embed = "model.embed_tokens.weight"
    if tied and embed in shapes and layout == "cpu-int4" and kinds.get(embed) in PACKED_LAYOUTS:
        # The CPU int4 kernel needs its own copy of a tied table for the output projection.
        total += tensor_bytes(shapes[embed], kinds[embed], quantization, layout, 2, embed)
    # The build holds, beyond the finished layers: the tensor (or fused q/k/v, gate/up pair)
    # being laid out in its runtime form, its read copy, the next tensor read ahead, and scratch.
    stored = {
        name: tensor_bytes(shape, kinds.get(name, ""), quantization, "packed", dtype_bytes, name)
        for name, shape in shapes.items()
    }
    fused: dict[str, int] = {}
    for name, size in per_tensor.items():
        for group in ("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"):
            if any(f".{g}." in name for g in group):
                key = name.rsplit(".", 2)[0] + "/" + group[0]
                fused[key] = fused.get(key, 0) + size + stored[name]
    biggest_stored = max(stored.values(), default=0)
    in_flight = max(
        max((per_tensor[n] + stored[n] for n in per_tensor), default=0),
        max(fused.values(), default=0),
    )
    peak = in_flight + biggest_stored + CONVERSION_SCRATCH
    matrices = [n for n, s in shapes.items() if len(s) == 2]
    formats = tuple(sorted({_runtime_kind(kinds.get(n, ""), quantization) for n in matrices}))
    return WeightPlan(total, peak, formats, layout)


def _runtime_kind(kind: str, quantization: str) -> str:
    if kind in PACKED_LAYOUTS:
        return kind if quantization != "none" else "dequantized"
    return quantization if quantization in ("int8", "int4") else kind


def weights_quantized(kinds: Mapping[str, str], quantization: str) -> bool:
    """Whether any matmul weight will be kept quantized."""
    if quantization in ("int8", "int4"):
        return True
    if quantization == "none":
        return False
    return any(k in PACKED_LAYOUTS or k in ("int8", "int4") for k in kinds.values())


def describe_need(
    label: str,
    plan: WeightPlan,
    kv_bytes: int,
    device: torch.device,
    free: int | None,
) -> str:
    where = "GPU" if device.type == "cuda" else "host RAM"
    need = plan.total_bytes + kv_bytes + (RUNTIME_OVERHEAD if device.type == "cpu" else 0)
    text = (
        f"{label} needs about {format_bytes(need)} of {where} to load: "
        f"{format_bytes(plan.runtime_bytes)} of weights ({'+'.join(plan.formats)}, "
        f"{plan.layout}), {format_bytes(plan.load_peak_bytes)} while converting"
    )
    if kv_bytes:
        text += f", {format_bytes(kv_bytes)} KV pool"
    if device.type == "cpu":
        text += f", {format_bytes(RUNTIME_OVERHEAD)} for the runtime"
    if free is not None:
        text += f"; {format_bytes(free)} is free"
    return text


WAYS_OUT = (
    "Ways out: a smaller quantization (quantization='int4', or a Q4_K_M GGUF instead of Q8_0/F16), "
    "device='cpu' when the GPU is too small, a smaller KV pool (kv_cache_memory or num_kv_blocks),"
    " or closing other programs."
)
