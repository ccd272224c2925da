"""GGUF file -> ModelConfig + dequantized float32 weights under HF names + HF tokenizer."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from transformers import AutoTokenizer

from engine.model.gguf_file import GGUFFile, GGUFTensor, read_gguf
from engine.model.loader import LoadedModel, check_weights, turn_end_token_ids
from engine.model.model_config import ModelConfig
from engine.model.tokenizer_cache import cached_tokenizer

# llama.cpp writes Mistral checkpoints as "llama"; Qwen2/Qwen3 keep their own name.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
# llama.cpp interleaves q/k rows for its rope layout only in the Llama converter.
PERMUTED_QK_ARCHITECTURES = ("llama",)

GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
ROPE_FREQS = "rope_freqs.weight"
_NO_DATA = torch.empty(0)  # stands in for tensors whose values gguf_config never reads


def load_gguf(path: Path) -> LoadedModel:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file does not exist: {path}")
    gguf_file = read_gguf(path)
    metadata = gguf_file.metadata
    arch = _architecture(metadata, path)
    row_orders = _rope_row_orders(gguf_file, arch) if arch in PERMUTED_QK_ARCHITECTURES else {}
    tensors = _dequantize_all(gguf_file, row_orders)
    config = _config(metadata, arch, tensors, path)
    weights = {_hf_name(name, path): t for name, t in tensors.items() if name != ROPE_FREQS}
    check_weights(config, weights, str(path))
    tokenizer = _tokenizer(metadata, path)
    return LoadedModel(config, weights, tokenizer, source=str(path), kind="gguf")


def gguf_config(gguf_file: GGUFFile) -> ModelConfig:
    """The ModelConfig from the header alone; of the tensors only a llama3 `rope_freqs` is read."""
    arch = _architecture(gguf_file.metadata, gguf_file.path)
    # _config needs tensor names only, plus the values of rope_freqs (one float per frequency).
    rope_freqs = [t for t in gguf_file.tensors if t.name == ROPE_FREQS]
    tensors = {t.name: _NO_DATA for t in gguf_file.tensors}
    tensors |= _dequantize_all(replace(gguf_file, tensors=rope_freqs), {})
    return _config(gguf_file.metadata, arch, tensors, gguf_file.path)


def _architecture(metadata: dict[str, Any], path: Path) -> str:
    arch = metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{path}: GGUF architecture {arch!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return arch


def _rope_row_orders(gguf_file: GGUFFile, arch: str) -> dict[str, np.ndarray]:
    """Row orders undoing llama.cpp's q/k row interleave (transformers' `_reverse_permute_weights`).

    The interleave moves whole rows and every quant block lies within a row, so reordering the
    quantized rows before dequantizing gives the same floats at a fraction of the copying.
    """
    heads = gguf_file.metadata.get(f"{arch}.attention.head_count")
    if heads is None:
        raise ValueError(f"{gguf_file.path}: GGUF metadata lacks {arch}.attention.head_count")
    kv_heads = gguf_file.metadata.get(f"{arch}.attention.head_count_kv", heads)
    heads_of = {"attn_q": int(heads), "attn_k": int(kv_heads)}
    orders = {}
    for t in gguf_file.tensors:
        parts = t.name.split(".")
        n_head = heads_of.get(parts[2]) if len(parts) == 4 and parts[0] == "blk" else None
        if n_head is None:
            continue
        rows = t.shape[0] if t.shape else 0
        if n_head <= 0 or rows == 0 or rows % (2 * n_head):
            raise ValueError(
                f"{gguf_file.path}: {t.name} has {rows} rows, which do not split into "
                f"{n_head} rope heads"
            )
        order = np.arange(rows).reshape(n_head, rows // n_head // 2, 2).swapaxes(1, 2)
        orders[t.name] = order.reshape(rows)
    return orders


def _dequantize_all(
    gguf_file: GGUFFile, row_orders: dict[str, np.ndarray]
) -> dict[str, torch.Tensor]:
    def one(t: GGUFTensor) -> tuple[str, torch.Tensor]:
        order = row_orders.get(t.name)
        data = t.data if order is None else t.data[order]
        array = gguf.quants.dequantize(data, t.qtype)
        # F32 tensors come back as read-only views of the mmap; copy those only.
        array = np.require(array.reshape(t.shape), np.float32, ["C", "W"])
        return t.name, torch.from_numpy(array)

    try:
        # numpy releases the GIL in the dequant kernels, so threads overlap the big tensors.
        with ThreadPoolExecutor() as pool:
            return dict(pool.map(one, gguf_file.tensors))
    except (ValueError, NotImplementedError) as e:
        raise ValueError(f"{gguf_file.path}: cannot dequantize tensors: {e}") from e


def _hf_name(gguf_name: str, path: Path) -> str:
    parts = gguf_name.split(".")
    if len(parts) == 2 and parts[0] in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{BLOCK_NAMES[parts[2]]}.{parts[3]}"
    raise ValueError(f"{path}: tensor {gguf_name!r} has no place in a Llama-family model")


def _config(
    metadata: dict[str, Any], arch: str, tensors: dict[str, torch.Tensor], path: Path
) -> ModelConfig:
    def meta(key: str, default=None):
        value = metadata.get(f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return value

    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ValueError(f"{path}: GGUF file has no tokenizer (tokenizer.ggml.tokens)")
    hidden, heads = int(meta("embedding_length")), int(meta("attention.head_count"))
    head_dim = int(meta("attention.key_length", hidden // heads))
    if int(meta("rope.dimension_count", head_dim)) != head_dim:
        raise ValueError(f"{path}: partial rotary embeddings are not supported")
    rope_theta = float(meta("rope.freq_base", 10000.0))
    eos = metadata.get("tokenizer.ggml.eos_token_id")
    turn_ends = turn_end_token_ids(
        {t: i for i, t in enumerate(tokens)}, metadata.get("tokenizer.chat_template")
    )
    return ModelConfig(
        architecture=arch,
        vocab_size=len(tokens),
        hidden_size=hidden,
        intermediate_size=int(meta("feed_forward_length")),
        num_layers=int(meta("block_count")),
        num_heads=heads,
        num_kv_heads=int(meta("attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=float(meta("attention.layer_norm_rms_epsilon")),
        rope_theta=rope_theta,
        max_position_embeddings=int(meta("context_length")),
        tie_word_embeddings="output.weight" not in tensors,
        rope_scaling=_rope_scaling(metadata, arch, tensors, rope_theta, head_dim, path),
        # Qwen2 has q/k/v biases and Qwen3 per-head q/k norms; the tensors say which is here.
        attention_bias="blk.0.attn_q.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(dict.fromkeys(([eos] if eos is not None else []) + list(turn_ends))),
        name=path.name,
    )


def _rope_scaling(
    metadata: dict[str, Any],
    arch: str,
    tensors: dict[str, torch.Tensor],
    rope_theta: float,
    head_dim: int,
    path: Path,
) -> dict | None:
    """HF-style rope_scaling from the GGUF metadata, or from the llama3 `rope_freqs` tensor."""
    if ROPE_FREQS in tensors:
        return _llama3_from_rope_freqs(tensors[ROPE_FREQS].numpy(), rope_theta, head_dim, path)
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind not in ("linear", "yarn"):
        raise ValueError(f"{path}: rope scaling type {kind!r} is not supported")
    scaling = {"rope_type": kind, "factor": float(metadata.get(f"{arch}.rope.scaling.factor"))}
    original = metadata.get(f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    return scaling


def _llama3_from_rope_freqs(
    factors: np.ndarray, rope_theta: float, head_dim: int, path: Path
) -> dict | None:
    """Recover HF's llama3 rope_scaling from the per-frequency divisors llama.cpp stores.

    llama.cpp keeps 1 for high frequencies, `factor` for low ones, and 1/((1-s)/factor + s) in
    between, where s = (orig_ctx * inv_freq / 2pi - low) / (high - low) is linear in inv_freq.
    Every Llama 3 release uses low_freq_factor 1; with it, a line fit through the ramp gives
    high_freq_factor and original_max_position_embeddings. The result is checked by rebuilding
    the divisors, so a file with some other pattern fails loudly instead of running wrong.
    """
    factors = factors.astype(np.float64)
    factor = float(factors.max())
    if factor <= 1.0:
        return None
    inv_freq = rope_theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ramp = (factors > 1 + 1e-6) & (factors < factor - 1e-6)
    if factors.shape != inv_freq.shape or ramp.sum() < 2:
        raise ValueError(f"{path}: rope_freqs.weight does not follow the llama3 rope pattern")
    s = (1 / factors[ramp] - 1 / factor) / (1 - 1 / factor)
    slope, intercept = np.polyfit(inv_freq[ramp], s, 1)
    if intercept >= 0:  # the ramp must rise with frequency: intercept = -low / (high - low)
        raise ValueError(f"{path}: rope_freqs.weight does not follow the llama3 rope pattern")
    low = 1.0
    high = round(float(1 - 1 / intercept), 4)
    original = round(float(slope * 2 * math.pi * (high - low)))
    scaling = {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": original,
    }
    if not np.allclose(_llama3_rope_divisors(inv_freq, scaling), factors, rtol=1e-4):
        raise ValueError(f"{path}: rope_freqs.weight does not follow the llama3 rope pattern")
    return scaling


def _llama3_rope_divisors(inv_freq: np.ndarray, scaling: dict) -> np.ndarray:
    """What llama.cpp's converter stores in `rope_freqs` for a llama3 rope_scaling dict."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (original / wavelen - low) / (high - low)
    ramp = 1 / ((1 - smooth) / factor + smooth)
    return np.where(
        wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, ramp)
    )


def _tokenizer(metadata: dict[str, Any], path: Path):
    def convert():
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        except Exception as e:  # transformers raises many types for a tokenizer it cannot convert
            raise ValueError(f"{path}: cannot build a tokenizer from the GGUF metadata: {e}") from e
        # Older transformers versions drop the template when converting a GGUF tokenizer.
        if tokenizer.chat_template is None:
            tokenizer.chat_template = metadata.get("tokenizer.chat_template")
        return tokenizer

    return cached_tokenizer(path, convert)
