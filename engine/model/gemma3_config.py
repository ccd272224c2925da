"""Gemma 3's config fields (beyond the Llama ones) from an HF config.json or a GGUF header.

Both produce keyword arguments for ModelConfig. The layer pattern: transformers writes
`layer_types` (older configs only `sliding_window_pattern`, default 6); a GGUF file does not
state it, and llama.cpp and transformers both assume 5 sliding layers then 1 full, repeating.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvscope.engine.model.model_config import FULL, SLIDING

HF_ARCHITECTURE = "Gemma3ForCausalLM"
SLIDING_WINDOW_PATTERN = 6  # every 6th layer is full, the other 5 slide
DEFAULT_THETA = {FULL: 1_000_000.0, SLIDING: 10_000.0}  # transformers' Gemma3TextConfig
DEFAULT_QUERY_PRE_ATTN_SCALAR = 256
# llama.cpp: Gemma 3 27B (62 layers) scales by hidden / heads, every other size by head_dim.
LAYERS_OF_27B = 62


def pattern_layer_types(num_layers: int, pattern: int = SLIDING_WINDOW_PATTERN) -> tuple[str, ...]:
    """transformers' rule: layer i slides unless (i + 1) is a multiple of `pattern`."""
    if pattern < 1:
        raise ValueError(f"sliding_window_pattern must be >= 1, got {pattern}")
    return tuple(SLIDING if (i + 1) % pattern else FULL for i in range(num_layers))


def hf_fields(hf: dict[str, Any], source: str) -> dict[str, Any]:
    """ModelConfig keyword arguments from a Gemma3ForCausalLM config.json."""
    for key in ("attn_logit_softcapping",):
        if hf.get(key) is not None:
            raise ValueError(f"{source}: {key} = {hf[key]} is not supported (only None)")
    if hf.get("use_bidirectional_attention"):
        raise ValueError(f"{source}: use_bidirectional_attention is not supported (causal only)")
    layers = int(hf["num_hidden_layers"])
    layer_types = tuple(hf.get("layer_types") or ())
    if not layer_types:
        pattern = hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern")
        layer_types = pattern_layer_types(layers, int(pattern or SLIDING_WINDOW_PATTERN))
    window = hf.get("sliding_window", 4096)
    if SLIDING in layer_types and window is None:
        raise ValueError(f"{source}: layer_types has sliding layers but sliding_window is null")
    full, local = _hf_rope(hf)
    return {
        "sliding_window": int(window) if SLIDING in layer_types else None,
        "layer_types": layer_types,
        "hidden_activation": hf.get("hidden_activation") or hf.get("hidden_act") or "",
        "query_pre_attn_scalar": float(
            hf.get("query_pre_attn_scalar", DEFAULT_QUERY_PRE_ATTN_SCALAR)
        ),
        "rope_theta": full[0],
        "rope_scaling": full[1],
        "rope_local_theta": local[0],
        "final_logit_softcapping": hf.get("final_logit_softcapping"),
        "qk_norm": True,
        "attention_bias": bool(hf.get("attention_bias", False)),
    }


def _hf_rope(
    hf: dict[str, Any],
) -> tuple[tuple[float, dict[str, Any] | None], tuple[float, dict[str, Any] | None]]:
    """(theta, rope_scaling) of the full and of the sliding layers.

    transformers 5 writes rope_parameters per layer type; older configs rope_theta,
    rope_local_base_freq and a rope_scaling that applies to the full layers only."""
    params = hf.get("rope_parameters") or {}
    out = []
    for kind in (FULL, SLIDING):
        p = dict(params.get(kind) or {})
        if kind == FULL and not p and hf.get("rope_scaling"):
            p = dict(hf["rope_scaling"])
        legacy = hf.get("rope_theta") if kind == FULL else hf.get("rope_local_base_freq")
        theta = float(p.pop("rope_theta", legacy or DEFAULT_THETA[kind]))
        rope_type = p.pop("rope_type", p.pop("type", "default"))
        scaling = None if rope_type == "default" else {"rope_type": rope_type, **p}
        if kind == SLIDING and scaling is not None:
            raise ValueError(f"rope scaling on sliding layers ({scaling}) is not supported")
        out.append((theta, scaling))
    return out[0], out[1]


def gguf_fields(
    metadata: dict[str, Any], num_layers: int, hidden: int, heads: int, head_dim: int, path: Path
) -> dict[str, Any]:
    """ModelConfig keyword arguments from a llama.cpp `gemma3` GGUF header."""
    window = metadata.get("gemma3.attention.sliding_window")
    if window is None:
        raise ValueError(f"{path}: GGUF metadata lacks gemma3.attention.sliding_window")
    scalar = hidden // heads if num_layers == LAYERS_OF_27B else head_dim
    cap = metadata.get("gemma3.final_logit_softcapping")
    if metadata.get("gemma3.attn_logit_softcapping") is not None:
        raise ValueError(f"{path}: gemma3.attn_logit_softcapping is not supported")
    return {
        "sliding_window": int(window),
        "layer_types": pattern_layer_types(num_layers),
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": float(scalar),
        "rope_local_theta": DEFAULT_THETA[SLIDING],
        "final_logit_softcapping": None if cap is None else float(cap),
        "qk_norm": True,
    }
