"""EngineConfig: every engine knob, listed once and validated once; nothing downstream re-checks.

The fields are the one list of knobs: each carries a `Knob` (help text, the values it takes,
whether it is a `kvscope` flag), and LLM's signature, the app's settings and dialog and the
command line are derived from them. A new knob is one field here.
"""

from __future__ import annotations

import os
from dataclasses import Field, dataclass, field, fields
from typing import Any

import torch

__all__ = [
    "ALLOCATORS",
    "BLOCK_SIZES",
    "CPU_QUANT_KERNELS",
    "DEFAULT_CPU_KV_MEMORY",
    "DTYPES",
    "EngineConfig",
    "FP8_MIN_CUDA_CAPABILITY",
    "KNOB",
    "Knob",
    "knob",
    "knob_of",
    "KV_DTYPES",
    "QUANTIZATIONS",
    "user_knobs",
]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
KV_DTYPES = ("auto", "float32", "float16", "bfloat16", "fp8")
FP8_MIN_CUDA_CAPABILITY = (8, 9)  # Triton has float8_e4m3 from Ada/Hopper on
BLOCK_SIZES = (8, 16, 32, 64, 128)
# "contiguous" is the naive baseline: max-length reservations, no sharing (engine/kv/contiguous).
ALLOCATORS = ("paged", "contiguous")
DEFAULT_CPU_KV_MEMORY = 1 << 30  # 1 GiB
CPU_PREFILL_BESIDE_DECODES = 256  # see EngineConfig.prefill_tokens_beside_decodes
# "auto": keep a GGUF's own quantization; "none": dequantize everything to `dtype` (the exact
# path); "int8"/"int4": quantize float matrices to nearest at load (engine.model.weight_source).
QUANTIZATIONS = ("auto", "none", "int8", "int4")
# Quantized matmuls on a CPU (engine/quant/cpu_layout.py): "torch" compiles nothing, which the
# app builds its first engine with while numba compiles in the background (app/desktop/
# kernel_switch.py).
CPU_QUANT_KERNELS = ("auto", "torch")

KNOB = "knob"  # the metadata key of a field's Knob


@dataclass(frozen=True)
class Knob:
    """How a field is offered to users; help text has no '%' (argparse formats it)."""

    help: str
    choices: tuple[object, ...] = ()  # empty: any value of the field's type
    user: bool = True  # False: the engine sets it itself, it is no LLM argument
    cli: bool = True  # False: no flag on `kvscope generate/chat/record`


def knob(
    default: Any, help: str, choices: tuple[object, ...] = (), user: bool = True, cli: bool = True
) -> Any:
    """A field with its Knob, e.g. `block_size: int = knob(16, "tokens per block", BLOCK_SIZES)`."""
    return field(default=default, metadata={KNOB: Knob(help, tuple(choices), user, cli)})


# cli=False: `kvscope generate/chat/record` keep the flags they have always had; LLM takes
# every user knob, the app's settings those EngineSettings names.
@dataclass
class EngineConfig:
    model: str | os.PathLike[str] | None = knob(
        None, "GGUF file or HF model folder (default: bundled)"
    )
    device: str = knob("auto", "auto (CUDA when there is one), cpu, cuda or cuda:N")
    dtype: str = knob(
        "auto",
        "weights and activations; auto: bfloat16 (float16 before Ampere) on CUDA, on a CPU "
        "bfloat16 for weights kept quantized and float32 otherwise",
        ("auto", *DTYPES),
    )
    kv_cache_dtype: str = knob(
        "auto",
        "auto: the dtype; fp8: 8-bit with per-head scales (CUDA compute capability 8.9 on)",
        KV_DTYPES,
        cli=False,
    )
    block_size: int = knob(16, "tokens per KV block", BLOCK_SIZES)
    num_kv_blocks: int | None = knob(
        None, "KV pool size in blocks (default: sized from the KV memory budget)"
    )
    kv_cache_memory: int | None = knob(
        None,
        "KV pool size in bytes (default: 1 GiB on a CPU, from gpu_memory_utilization on CUDA)",
        cli=False,
    )
    gpu_memory_utilization: float = knob(
        0.9, "share of the GPU's memory for weights, activations and the KV pool", cli=False
    )
    max_model_len: int | None = knob(
        None, "longest sequence in tokens (default: the model's context length)"
    )
    max_num_seqs: int = knob(64, "sequences batched together at most")
    max_num_batched_tokens: int | None = knob(
        None, "tokens per step at most (default: 512 on a CPU, 4096 on CUDA)", cli=False
    )
    enable_prefix_caching: bool = knob(
        True, "reuse the KV blocks of a prompt prefix seen before", cli=False
    )
    allocator: str = knob(
        "paged",
        "paged: blocks on demand, shared prefixes; contiguous: a max-length reservation per "
        "sequence (the naive baseline)",
        ALLOCATORS,
        cli=False,
    )
    # No flag: on the command line --seed is the sampling seed of the request.
    seed: int = knob(0, "seeds the sampler of requests that bring no seed", cli=False)
    quantization: str = knob(
        "auto",
        "auto: keep a GGUF's own (Q4_K_M stays 4-bit); none: dequantize to the dtype (exact, "
        "4-8x the memory); int8/int4: quantize a float checkpoint at load",
        QUANTIZATIONS,
    )
    num_threads: int | None = knob(
        None,
        "CPU threads for the math (default: the physical cores less one, so a busy core "
        "elsewhere cannot stall every op; engine/cpu_threads.py)",
    )
    cpu_quant_kernel: str = knob(
        "auto",
        "quantized matmuls on a CPU: auto: numba's kernels where numba is installed (compiled "
        "once per machine, tens of seconds, then cached), else torch's; torch: torch's kernels "
        "(2-5x slower), nothing compiled",
        CPU_QUANT_KERNELS,
        cli=False,
    )
    weights_quantized: bool = knob(
        False, "on a CPU, quantized weights run in bfloat16 (see torch_dtype)", user=False
    )
    # Engine-internal: False keeps every layer in one KV group whose blocks are never released
    # (sliding layers still attend within their windows): the comparison `kvscope bench` draws.
    release_window_blocks: bool = knob(
        True, "sliding-window layers give back KV blocks that fell out of the window", user=False
    )

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
        for f in fields(self):
            value, choices = getattr(self, f.name), f.metadata[KNOB].choices
            if choices and value not in choices:
                raise ValueError(f"{f.name} {value!r} is not one of {choices}")
        if self.kv_cache_dtype == "fp8" and self.torch_device.type == "cuda":
            capability = torch.cuda.get_device_capability(self.torch_device)
            if capability < FP8_MIN_CUDA_CAPABILITY:
                raise ValueError(
                    f"kv_cache_dtype 'fp8' needs CUDA compute capability >= "
                    f"{FP8_MIN_CUDA_CAPABILITY}, this GPU has {capability}"
                )
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
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(
                f"num_threads must be >= 1 (or None for the default), got {self.num_threads}"
            )
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )

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

    @property
    def prefill_tokens_beside_decodes(self) -> int | None:
        """Prompt tokens a step takes at most while decodes run in it (None: the whole budget).

        Every decode in a step waits for its prompt chunk, and on a CPU a chunk costs about
        linearly in its tokens, so the cap bounds the decodes' inter-token time. 256 on a CPU: a
        chunk that long still amortizes the AMX GEMM's dequantizing (engine/quant/cpu_layout.py),
        so a long prompt beside decodes prefills 13-16% slower while their steps take ~300 ms
        instead of ~420 (`kvscope bench --mixed`; PERFORMANCE.md, "Mixed steps"). It holds for
        an explicit max_num_batched_tokens too: a what-if replay passes the recorded budget
        explicitly and must schedule as the recorded CPU engine did (a budget of 256 or less
        leaves it idle)."""
        if self.torch_device.type != "cpu":
            return None
        return min(CPU_PREFILL_BESIDE_DECODES, self.batched_tokens_limit)


def user_knobs() -> tuple[Field[Any], ...]:
    """The fields callers set, in LLM's argument order; not the ones the engine sets itself."""
    return tuple(f for f in fields(EngineConfig) if f.metadata[KNOB].user)


def knob_of(name: str) -> Knob:
    """The Knob of one EngineConfig field, e.g. `knob_of("block_size").choices`."""
    found: Knob = EngineConfig.__dataclass_fields__[name].metadata[KNOB]  # metadata is untyped
    return found
