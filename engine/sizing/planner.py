"""KV-cache arithmetic from a model's config alone: bytes per token, blocks, what fits in VRAM.

Nothing here loads weights. A model's shape comes from config.json, a GGUF header, or three
numbers; the figures are the ones our engine uses, so `predict_num_blocks` equals the pool
`LLM(kv_cache_memory=...)` builds. The figures as a record and as text are
`engine.sizing.kv_plan.KVPlan`.

The budget is `vram x gpu_memory_utilization - weights`. The engine on CUDA also subtracts one
step's activations, which it measures at load; the plan leaves them out, so on a GPU its block
count is an upper bound. Weights not given are counted from the model's own tensor list in the
form the engine keeps them on a GPU (`engine.sizing.weight_plan`): a GGUF's quantized tensors in the
packed format, float tensors at the weights dtype, `quantization="int8"/"int4"` as quantized at
load, `"none"` all dense. Building also needs `load_peak_bytes` on top for a moment (one layer
converted twice plus scratch); `fits_to_load` checks that too. With only a config.json, every
tensor the forward keeps is estimated at the weights dtype.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from kvscope.engine.input_file import check_input_file
from kvscope.engine.kv.layout import KVLayout

# format_bytes and parse_bytes are read off this module too (the app's picker and CLI).
from kvscope.engine.memory.byte_units import format_bytes, parse_bytes
from kvscope.engine.model.model_config import ModelConfig
from kvscope.engine.sizing.kv_plan import KVPlan

if TYPE_CHECKING:  # torch and the loaders cost seconds to import; plans from flags need neither
    import torch

    from kvscope.engine.model.loaded_model import LoadedModel

# What a plan is of: a config, a loaded model, a file or folder, or None / "default" (bundled).
ModelSpec: TypeAlias = "ModelConfig | LoadedModel | str | os.PathLike[str] | None"

__all__ = [
    "blocks_per_context",
    "bytes_per_token",
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "DTYPE_BYTES",
    "dtype_name",
    "estimate_weight_bytes",
    "format_bytes",
    "kv_layout_of",
    "model_config",
    "parse_bytes",
    "plan_kv",
    "predict_num_blocks",
    "sequence_kv_bytes",
    "WEIGHT_DTYPES",
    "weights_header",
]

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
WEIGHT_DTYPES = ("fp32", "bf16", "fp16")
_DTYPE_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float8": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
}
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # the engine's default


def dtype_name(dtype: object) -> str:
    """Canonical KV dtype name ("fp32", "bf16", "fp16", "fp8") of a name or a torch.dtype."""
    key = str(dtype).lower().removeprefix("torch.")
    name = _DTYPE_ALIASES.get(key, key)
    if name not in DTYPE_BYTES:
        raise ValueError(
            f"dtype {dtype!r} is not one of {tuple(DTYPE_BYTES)} (or {tuple(_DTYPE_ALIASES)})"
        )
    return name


def model_config(model: ModelSpec = None) -> ModelConfig:
    """A ModelConfig without weights: from a ModelConfig or LoadedModel, a .gguf file, an HF
    folder or its config.json, a folder holding one .gguf, or None / "default" (bundled model).
    """
    if isinstance(model, ModelConfig):
        return model
    config = getattr(model, "config", None)
    if isinstance(config, ModelConfig):  # a LoadedModel
        return config
    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"no model config in a {type(model).__name__}")  # Path(model) would raise
    # Imported here: the loaders bring in transformers, which plans from flags never need.
    from kvscope.engine.model.gguf.identity import is_gguf_file
    from kvscope.engine.model.gguf.loader import gguf_config
    from kvscope.engine.model.gguf.split import read_gguf_model
    from kvscope.engine.model.hf_loader import hf_config
    from kvscope.engine.model.loader import default_model_path

    path = default_model_path() if model is None or model == "default" else Path(model).expanduser()
    if not path.is_dir():  # a file: regular (a device or a pipe is no model), or missing
        check_input_file(path, "model path")
    if path.is_file() and path.suffix.lower() == ".json":
        return hf_config(path.parent)
    if path.is_dir():
        if (path / "config.json").is_file():
            return hf_config(path)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) != 1:
            raise ValueError(
                f"{path} has no config.json and {len(ggufs)} .gguf files "
                "(expected an HF folder, its config.json, or exactly one .gguf)"
            )
        path = ggufs[0]
    if not is_gguf_file(path):  # by suffix or magic: Ollama's blobs are hash-named
        raise ValueError(f"{path} is neither a .gguf file, a config.json nor a model folder")
    return gguf_config(read_gguf_model(path))


def estimate_weight_bytes(mc: ModelConfig, dtype: str = "fp16") -> int:
    """Bytes of every tensor the engine's forward keeps, at `dtype` (a tied head counts once)."""
    from kvscope.engine.model.loaded_model import expected_weight_shapes

    name = dtype_name(dtype)
    if name not in WEIGHT_DTYPES:
        raise ValueError(f"weights dtype {dtype!r} is not one of {WEIGHT_DTYPES}")
    elements = sum(math.prod(shape) for shape in expected_weight_shapes(mc).values())
    return elements * DTYPE_BYTES[name]


def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: object) -> int:
    """K and V, every layer: 2 x layers x kv_heads x head_dim x dtype bytes."""
    return 2 * num_layers * num_kv_heads * head_dim * DTYPE_BYTES[dtype_name(dtype)]


def kv_layout_of(mc: ModelConfig, block_size: int) -> KVLayout:
    """The engine's KV layout for this model (paged allocator, windows honoured)."""
    return KVLayout.for_windows(mc.layer_windows(), block_size)


def predict_num_blocks(
    model: ModelSpec,
    block_size: int,
    kv_dtype: object,
    kv_budget_bytes: int,
) -> int:
    """Blocks the engine's pool gets for a KV byte budget (its `kv_cache_memory`). A block
    holds one KV group's layers (all of them for a model whose layers attend alike)."""
    mc = model_config(model)
    _check_positive("block_size", block_size)
    group_size = kv_layout_of(mc, block_size).group_size
    per_block = block_size * bytes_per_token(group_size, mc.num_kv_heads, mc.head_dim, kv_dtype)
    return max(0, int(kv_budget_bytes)) // per_block


def blocks_per_context(mc: ModelConfig, block_size: int, context: int) -> int:
    """Blocks one sequence of `context` tokens holds while it decodes: every block of a full
    layer group, a sliding group's only under its window (plus one for a window mid-block)."""
    return kv_layout_of(mc, block_size).max_blocks_held(context, 1)


def sequence_kv_bytes(mc: ModelConfig, context: int, kv_dtype: object) -> int:
    """The exact K/V bytes of one sequence of `context` tokens: a sliding layer keeps its
    window, a full one every token."""
    per_layer_token = bytes_per_token(1, mc.num_kv_heads, mc.head_dim, kv_dtype)
    tokens = sum(context if w is None else min(context, w) for w in mc.layer_windows())
    return per_layer_token * tokens


def plan_kv(
    model: ModelSpec = None,
    *,
    context: int,
    dtype: object = "fp16",
    batch: int = 1,
    block_size: int = 16,
    vram_bytes: int | str | None = None,
    weights_bytes: int | str | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    weights_dtype: str | None = None,
    num_layers: int | None = None,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    quantization: str = "auto",
) -> KVPlan:
    """The KV plan for `model` (see `model_config`), or for explicit layers / heads / head dim.

    Without `weights_bytes`, a model's weights are estimated at `weights_dtype` (default: the KV
    dtype, or fp16 for an fp8 cache); a plan from explicit numbers counts them as 0.
    """
    shape = {"num_layers": num_layers, "num_kv_heads": num_kv_heads, "head_dim": head_dim}
    if any(v is not None for v in shape.values()):
        if model is not None:
            raise ValueError("give a model or num_layers/num_kv_heads/head_dim, not both")
        if num_layers is None or num_kv_heads is None or head_dim is None:
            missing = [name for name, v in shape.items() if v is None]
            raise ValueError(f"a plan without a model needs {', '.join(missing)} as well")
        mc, label = None, "flags"
    else:
        mc = model_config(model)
        num_layers, num_kv_heads, head_dim = mc.num_layers, mc.num_kv_heads, mc.head_dim
        label = mc.name or "model"
    for name, value in (
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("context", context),
        ("batch", batch),
        ("block_size", block_size),
    ):
        _check_positive(name, value)
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    kv_dtype = dtype_name(dtype)
    per_token = bytes_per_token(num_layers, num_kv_heads, head_dim, kv_dtype)
    if mc is not None:
        layout = kv_layout_of(mc, block_size)
        windows = [w for w in mc.layer_windows() if w is not None]
        per_block = block_size * bytes_per_token(
            layout.group_size, num_kv_heads, head_dim, kv_dtype
        )
        blocks_per_seq = layout.max_blocks_held(context, 1)
        per_sequence = sequence_kv_bytes(mc, context, kv_dtype)
    else:
        layout, windows = None, []
        per_block = per_token * block_size
        blocks_per_seq = -(-context // block_size)
        per_sequence = per_token * context
    num_groups = layout.num_groups if layout is not None else 1

    vram = None if vram_bytes is None else parse_bytes(vram_bytes)
    if vram is not None and vram < 1:
        raise ValueError(f"vram must be a positive byte count, got {vram_bytes!r}")
    weights, source, w_dtype, w_format, peak = None, "none", None, None, None
    if weights_bytes is not None:
        weights, source = parse_bytes(weights_bytes), "given"
    elif mc is not None:
        w_dtype = dtype_name(weights_dtype or ("fp16" if kv_dtype == "fp8" else kv_dtype))
        weights, source = estimate_weight_bytes(mc, w_dtype), "estimated"
        header = weights_header(model)
        if header is not None:
            from kvscope.engine.sizing.weight_plan import plan_weights

            torch_dtype = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[w_dtype]
            wp = plan_weights(
                *header,
                quantization,
                _torch_device("cuda"),
                _torch_dtype(torch_dtype),
                mc.tie_word_embeddings,
            )
            weights, peak = wp.runtime_bytes, wp.load_peak_bytes
            w_format = "+".join(wp.formats).replace("float32", w_dtype).replace("F32", w_dtype)

    budget = deficit = num_blocks = max_tokens = max_seqs = fits = fits_to_load = None
    if vram is not None:
        usable = int(vram * gpu_memory_utilization)
        fits_to_load = (weights or 0) + (peak or 0) <= usable
        raw = usable - (weights or 0)  # the engine's rounding
        budget, deficit = max(raw, 0), max(-raw, 0)
        num_blocks = budget // per_block
        # Tokens every group can hold at once (a sliding group holds only its window of them).
        max_tokens = num_blocks // num_groups * block_size
        max_seqs = num_blocks // blocks_per_seq
        fits = batch * blocks_per_seq <= num_blocks

    return KVPlan(
        model=label,
        num_layers=num_layers,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=kv_dtype,
        dtype_bytes=DTYPE_BYTES[kv_dtype],
        context=context,
        model_max_context=mc.max_position_embeddings if mc else None,
        batch=batch,
        block_size=block_size,
        bytes_per_token=per_token,
        bytes_per_sequence=per_sequence,
        batch_bytes=per_sequence * batch,
        bytes_per_block=per_block,
        blocks_per_sequence=blocks_per_seq,
        batch_blocks=blocks_per_seq * batch,
        vram_bytes=vram,
        gpu_memory_utilization=gpu_memory_utilization,
        weights_bytes=weights,
        weights_source=source,
        weights_dtype=w_dtype,
        weights_format=w_format,
        load_peak_bytes=peak,
        kv_budget_bytes=budget,
        budget_deficit_bytes=deficit,
        num_blocks=num_blocks,
        max_tokens_in_budget=max_tokens,
        max_sequences_at_context=max_seqs,
        fits=fits,
        fits_to_load=fits_to_load,
        sliding_window=max(windows) if windows else None,
        sliding_layers=len(windows),
        kv_groups=num_groups,
    )


def _torch_device(name: str) -> torch.device:
    import torch

    return torch.device(name)


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    dtype: torch.dtype = getattr(torch, name)
    return dtype


def weights_header(model: ModelSpec) -> tuple[dict[str, tuple[int, ...]], dict[str, str]] | None:
    """(shapes, kinds) of every weight tensor, from a GGUF header or safetensors headers; None
    for a ModelConfig or a lone config.json. Reads no tensor data."""
    if model is not None and not isinstance(model, (str, os.PathLike)):
        weights = getattr(model, "weights", None)  # a LoadedModel
        return (weights.shapes(), weights.kinds()) if weights is not None else None
    from kvscope.engine.model.gguf.identity import is_gguf_file
    from kvscope.engine.model.gguf.loader import GGUFSource
    from kvscope.engine.model.gguf.split import read_gguf_model
    from kvscope.engine.model.loader import default_model_path

    path = default_model_path() if model is None or model == "default" else Path(model).expanduser()
    if path.is_dir() and not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        path = ggufs[0] if len(ggufs) == 1 else path
    if is_gguf_file(path):
        source = GGUFSource(read_gguf_model(path), {})
        return source.shapes(), source.kinds()
    folder = path if path.is_dir() else path.parent
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    from kvscope.engine.model.weight_source import SafetensorsSource

    safetensors = SafetensorsSource(files)
    return safetensors.shapes(), safetensors.kinds()


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
