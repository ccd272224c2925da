"""EngineConfig: every engine knob, validated once here; nothing downstream re-checks."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
KV_DTYPES = ("auto", "float32", "float16", "bfloat16", "fp8")
FP8_MIN_CUDA_CAPABILITY = (8, 9)  # Triton has float8_e4m3 from Ada/Hopper on
BLOCK_SIZES = (8, 16, 32, 64, 128)
# "contiguous" is the naive baseline: max-length reservations, no sharing (engine/kv/contiguous).
ALLOCATORS = ("paged", "contiguous")
DEFAULT_CPU_KV_MEMORY = 1 << 30  # 1 GiB
# "auto": keep a GGUF's own quantization; "none": dequantize everything to `dtype` (the exact
# path); "int8"/"int4": quantize float matrices to nearest at load (engine.model.weight_source).
QUANTIZATIONS = ("auto", "none", "int8", "int4")


@dataclass
class EngineConfig:
    model: str | os.PathLike | None = None
    device: str = "auto"
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    allocator: str = "paged"
    seed: int = 0
    quantization: str = "auto"
    # Set by the engine once it knows the weights: on CPU, quantized weights run in bfloat16.
    weights_quantized: bool = False

    def __post_init__(self) -> None:
        if self.device != "auto":
            try:
                dev = torch.device(self.device)
            except RuntimeError as e:
                raise ValueError(f"device {self.device!r} is not a valid torch device") from e
            if dev.type not in ("cpu", "cuda"):
                raise ValueError(f"device {self.device!r}: only 'auto', 'cpu' and 'cuda' work")
            if dev.type == "cuda" and not torch.cuda.is_available():
                raise ValueError(f"device {self.device!r} requested but CUDA is not available")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {('auto', *DTYPES)}")
        if self.kv_cache_dtype not in KV_DTYPES:
            raise ValueError(f"kv_cache_dtype {self.kv_cache_dtype!r} is not one of {KV_DTYPES}")
        if self.kv_cache_dtype == "fp8" and self.torch_device.type == "cuda":
            capability = torch.cuda.get_device_capability(self.torch_device)
            if capability < FP8_MIN_CUDA_CAPABILITY:
                raise ValueError(
                    f"kv_cache_dtype 'fp8' needs CUDA compute capability >= "
                    f"{FP8_MIN_CUDA_CAPABILITY}, this GPU has {capability}"
                )
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size {self.block_size} is not one of {BLOCK_SIZES}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise ValueError(
                f"kv_cache_memory must be a positive byte count, got {self.kv_cache_memory}"
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if self.allocator not in ALLOCATORS:
            raise ValueError(f"allocator {self.allocator!r} is not one of {ALLOCATORS}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization {self.quantization!r} is not one of {QUANTIZATIONS}")

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype != "auto":
            return DTYPES[self.dtype]
        if self.torch_device.type == "cuda":
            # Native bf16 only (Ampere on): on a T4 bf16 would be emulated.
            native = torch.cuda.is_bf16_supported(including_emulation=False)
            return torch.bfloat16 if native else torch.float16
        # Quantized weights on a CPU run through torch's int4 kernel, which takes bfloat16
        # activations; in float32 they would be dequantized on every call, ~30x slower
        # (engine/quant/cpu_layout.py). Dense weights stay float32, the exact path.
        return torch.bfloat16 if self.weights_quantized else torch.float32

    @property
    def kv_torch_dtype(self) -> torch.dtype:
        if self.kv_cache_dtype == "fp8":
            return torch.float8_e4m3fn  # with per-layer, per-KV-head scales (see KVCache)
        return self.torch_dtype if self.kv_cache_dtype == "auto" else DTYPES[self.kv_cache_dtype]

    @property
    def batched_tokens_limit(self) -> int:
        """Tokens per step; smaller on CPU so one prompt chunk cannot stall decodes for long."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        default = 512 if self.torch_device.type == "cpu" else 4096
        return max(default, self.max_num_seqs)
