"""y = x @ W.T (+ bias) for a weight kept dense or quantized, on whichever device it lives.

Where a weight goes (`place`), by what was measured (engine/quant/cpu_layout.py for the CPU):

    dense float           the compute dtype, transposed to [in, out] (on CPU `x @ w` runs up to
                          3x faster than F.linear at decode batch sizes: 213 vs 620 us per layer)
    quantized, CUDA       the packed format itself; Triton dequantizes inside the GEMM
    quantized, CPU bf16   numba's K-major layout (`cpu_layout`, kernels/cpu_gemv.py); without
                          numba torch's int4 kernel layout, bf16 dense for Q6_K
    quantized, CPU fp32   the packed format; each call dequantizes a few rows at a time and
                          multiplies in float32 (exact weights, ~3x slower than dense: used
                          only where dense float32 does not fit, engine/sizing/float32_weights.py)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from kvscope import kernels
from kvscope.engine.quant.cpu_layout import CpuQuantLinear, cpu_layout
from kvscope.kernels.quant_format import QuantizedTensor, cat_rows, quantized_matmul_torch

Weight = torch.Tensor | QuantizedTensor


class Linear:
    def __init__(
        self,
        weight: torch.Tensor | QuantizedTensor | CpuQuantLinear,
        bias: torch.Tensor | None = None,
        transposed: bool = True,
        kind: str = "",
    ) -> None:
        self.weight = weight
        self.bias = bias
        self.transposed = transposed  # a dense weight kept as [in, out]
        dtype = str(getattr(weight, "dtype", "")).removeprefix("torch.")
        self.kind = kind or getattr(weight, "kind", "") or dtype

    @property
    def layout(self) -> str:
        w = self.weight
        if isinstance(w, CpuQuantLinear):
            if w.gemv is not None:
                return "cpu-gemv"
            return "cpu-int4" if w.dense is None else "cpu-bf16-dense"
        if isinstance(w, QuantizedTensor):
            return "triton" if w.device.type == "cuda" else "dequant-per-call"
        return "dense"

    @property
    def nbytes(self) -> int:
        w = self.weight
        size = w.nbytes if not isinstance(w, torch.Tensor) else w.numel() * w.element_size()
        return size + (0 if self.bias is None else self.bias.numel() * self.bias.element_size())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if isinstance(w, torch.Tensor):
            if not self.transposed:
                return F.linear(x, w, self.bias)
            return torch.addmm(self.bias, x, w) if self.bias is not None else x @ w
        if isinstance(w, CpuQuantLinear):
            y = w(x)
        elif w.device.type == "cuda":
            y = kernels.quantized_matmul(x, w)
        else:
            y = quantized_matmul_torch(x, w)
        return y if self.bias is None else y + self.bias


class SplitLinear:
    """Several matrices applied to one input whose formats differ (a Q6_K v beside Q4_K q and
    k): separate matmuls, outputs concatenated, so callers still see one projection."""

    def __init__(self, parts: list[Linear]) -> None:
        self.parts = parts

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def layout(self) -> str:
        return "+".join(dict.fromkeys(p.layout for p in self.parts))

    @property
    def kind(self) -> str:
        return "+".join(dict.fromkeys(p.kind for p in self.parts))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)


def place(
    w: Weight, device: torch.device, dtype: torch.dtype, bias: torch.Tensor | None = None
) -> Linear:
    """One weight in its runtime form on `device` (see the module docstring)."""
    bias = None if bias is None else bias.to(device=device, dtype=dtype)
    if isinstance(w, torch.Tensor):
        kind = str(w.dtype).removeprefix("torch.")
        # Transposed before it moves: on a GPU the build then never holds two copies there.
        return Linear(w.to(dtype).t().contiguous().to(device), bias, kind=kind)
    if device.type == "cuda":
        return Linear(w.to(device), bias)
    if dtype == torch.bfloat16:
        return Linear(cpu_layout(w), bias)
    return Linear(w, bias)


def fused(
    weights: list[Weight],
    device: torch.device,
    dtype: torch.dtype,
    biases: list[torch.Tensor] | None = None,
) -> Linear | SplitLinear:
    """Matrices sharing an input as one matmul (q/k/v, gate/up): fewer, larger GEMMs are what a
    CPU, and a GPU at small batch, rewards. Falls back to SplitLinear when formats differ."""
    bias = None if biases is None else torch.cat(biases)
    dense = [w for w in weights if isinstance(w, torch.Tensor)]
    if len(dense) == len(weights):
        return place(torch.cat(dense), device, dtype, bias)
    quantized = [w for w in weights if isinstance(w, QuantizedTensor)]
    if len(quantized) == len(weights) and all(quantized[0].same_layout(w) for w in quantized):
        return place(cat_rows(quantized), device, dtype, bias)
    per_bias: Sequence[torch.Tensor | None] = biases or [None] * len(weights)
    return SplitLinear([place(w, device, dtype, b) for w, b in zip(weights, per_bias, strict=True)])


class Embedding:
    """Token rows of the embedding table; quantized tables dequantize only the rows looked up."""

    def __init__(self, w: Weight, device: torch.device, dtype: torch.dtype) -> None:
        self.dtype = dtype
        if isinstance(w, QuantizedTensor):
            self.weight: Weight = w.to(device)
        else:
            self.weight = w.to(device=device, dtype=dtype)

    @property
    def nbytes(self) -> int:
        w = self.weight
        return w.nbytes if isinstance(w, QuantizedTensor) else w.numel() * w.element_size()

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if isinstance(w, QuantizedTensor):
            return w.dequantize(self.dtype, rows=ids)
        return F.embedding(ids, w)

    def as_head(self, device: torch.device, dtype: torch.dtype) -> Linear:
        """The tied output projection: the same table, no copy where the device allows it."""
        w = self.weight
        if isinstance(w, torch.Tensor):
            return Linear(w, transposed=False)
        if device.type == "cuda" or dtype != torch.bfloat16:
            return Linear(w)
        return Linear(cpu_layout(w))  # the CPU kernel wants its own layout: a second copy
