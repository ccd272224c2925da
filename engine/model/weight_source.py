"""Where a model's weights come from, one tensor at a time.

A `WeightSource` knows every tensor's name and shape up front (from a GGUF header or the
safetensors headers) and reads one tensor when asked: the model is built layer by layer from it,
so at no time is a second copy of the whole model alive, and nothing is kept for later (a
rebuild reads the file again; the OS page cache makes that fast). `read` returns the tensor in
its kept form for a quantization mode:

    "auto"   a GGUF's quantized tensors as `QuantizedTensor` (exact), everything else as stored
    "none"   every tensor as a float tensor in `dtype` (GGUF blocks dequantized): the exact path
    "int8" / "int4"   float matrices quantized to nearest at load (`engine.quant.rtn`); a
             GGUF's already-quantized tensors keep their own format

Files are read with plain reads, not through a memory map, so the pages read do not stay in the
process's resident set after the tensor is converted.
"""

from __future__ import annotations

from collections.abc import Iterable
from io import BufferedReader
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from kvscope.engine.quant.rtn import GROUP_SIZE, quantize_rtn
from kvscope.kernels.quant_format import DEQUANT_CHUNK_ELEMENTS, QuantizedTensor

QUANTIZATIONS = ("auto", "none", "int8", "int4")
RTN_GROUP_SIZES = (GROUP_SIZE, 64, 32)  # 128 where in_features allow it, smaller for tiny models

Weight = torch.Tensor | QuantizedTensor


class WeightSource(Protocol):
    def shapes(self) -> dict[str, tuple[int, ...]]: ...

    def kinds(self) -> dict[str, str]:
        """Each tensor's stored type as the user knows it: "Q4_K", "F16", "bfloat16"."""
        ...

    def read(self, name: str, quantization: str, dtype: torch.dtype) -> Weight: ...


def finish(w: Weight, name: str, quantization: str, dtype: torch.dtype) -> Weight:
    """Apply a quantization mode to one freshly read tensor (float or QuantizedTensor)."""
    if isinstance(w, QuantizedTensor):
        return _dequantized(w, dtype) if quantization == "none" else w
    if quantization in ("int8", "int4") and w.dim() == 2 and _quantizable(name):
        group = next((g for g in RTN_GROUP_SIZES if w.shape[1] % g == 0), None)
        if group is not None:
            return quantize_rtn(w, 8 if quantization == "int8" else 4, group)
    return w.to(dtype)


def _dequantized(w: QuantizedTensor, dtype: torch.dtype) -> torch.Tensor:
    """W in `dtype`, a few rows at a time: no float32 copy of a whole (vocab-sized) matrix."""
    n, k = w.shape
    out = torch.empty((n, k), dtype=dtype)
    step = max(1, DEQUANT_CHUNK_ELEMENTS // k)
    for start in range(0, n, step):
        rows = slice(start, min(n, start + step))
        out[rows] = w.dequantize(dtype, rows)
    return out


def _quantizable(name: str) -> bool:
    """Matrices the forward multiplies by (and the embedding); never norms or biases."""
    return name.endswith(".weight") and "norm" not in name


class TensorDictSource:
    """Weights already in memory (tests, benchmarks, a model built in code)."""

    def __init__(self, tensors: dict[str, Weight], kinds: dict[str, str] | None = None) -> None:
        self.tensors = tensors
        self._kinds = kinds or {n: _kind_of(t) for n, t in tensors.items()}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: tuple(t.shape) for n, t in self.tensors.items()}

    def kinds(self) -> dict[str, str]:
        return dict(self._kinds)

    def read(self, name: str, quantization: str, dtype: torch.dtype) -> Weight:
        return finish(self.tensors[name], name, quantization, dtype)


def _kind_of(t: Weight) -> str:
    return t.kind if isinstance(t, QuantizedTensor) else str(t.dtype).removeprefix("torch.")


def materialize(
    source: WeightSource, quantization: str = "auto", dtype: torch.dtype = torch.float32
) -> TensorDictSource:
    """Read every tensor once into memory (for callers that build many engines from one file)."""
    tensors = {name: source.read(name, quantization, dtype) for name in source.shapes()}
    return TensorDictSource(tensors)


class SafetensorsSource:
    """An HF folder's *.safetensors files, read one tensor at a time."""

    def __init__(self, files: Iterable[Path], skip: Iterable[str] = ()) -> None:
        from safetensors import safe_open

        self._where: dict[str, Path] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._kinds: dict[str, str] = {}
        skip = set(skip)
        for file in files:
            try:
                with safe_open(file, framework="pt") as f:
                    for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                        if name in skip or name.endswith("rotary_emb.inv_freq"):
                            continue
                        sl = f.get_slice(name)
                        self._where[name] = file
                        self._shapes[name] = tuple(sl.get_shape())
                        self._kinds[name] = str(sl.get_dtype()).lower()
            except Exception as e:  # safetensors raises its own error type for a bad header
                raise ValueError(f"{file} is not a readable safetensors file: {e}") from e

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._shapes)

    def kinds(self) -> dict[str, str]:
        return dict(self._kinds)

    def read(self, name: str, quantization: str, dtype: torch.dtype) -> Weight:
        from safetensors import safe_open

        file = self._where[name]
        try:
            # Opened per tensor: the map closes again, so read pages leave the resident set.
            with safe_open(file, framework="pt") as f:
                tensor = f.get_tensor(name)
        except Exception as e:
            raise ValueError(f"{file}: cannot read tensor {name!r}: {e}") from e
        return finish(tensor, name, quantization, dtype)


def read_exact(f: BufferedReader, offset: int, count: int) -> npt.NDArray[np.uint8]:
    """`count` bytes of an open binary file at `offset`, as a fresh writable uint8 array."""
    out = np.empty(count, dtype=np.uint8)
    f.seek(offset)
    got = f.readinto(out.data)
    if got != count:
        raise ValueError(
            f"{f.name}: expected {count} bytes at {offset}, the file ended after {got}"
        )
    return out
