"""GGUF file -> ModelConfig + dequantized float32 weights under HF names + HF tokenizer."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gguf
import numpy as np
import torch
from transformers import AutoTokenizer

from engine.model.loader import LoadedModel, check_weights, turn_end_token_ids
from engine.model.model_config import ModelConfig

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


def load_gguf(path: Path) -> LoadedModel:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file does not exist: {path}")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the reader fails in many ways (bad magic, truncation, bad lengths)
        raise ValueError(f"{path} is not a readable GGUF file: {e}") from e
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{path}: GGUF architecture {arch!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    tensors = _dequantize_all(reader, path)
    config = _config(reader, arch, tensors, path)
    weights = {_hf_name(name, path): t for name, t in tensors.items() if name != ROPE_FREQS}
    if arch in PERMUTED_QK_ARCHITECTURES:
        for name, t in weights.items():
            if ".self_attn.q_proj." in name:
                weights[name] = _unpermute_rope(t, config.num_heads)
            elif ".self_attn.k_proj." in name:
                weights[name] = _unpermute_rope(t, config.num_kv_heads)
    check_weights(config, weights, str(path))
    tokenizer = _tokenizer(reader, path)
    return LoadedModel(config, weights, tokenizer, source=str(path), kind="gguf")


def _field(reader: gguf.GGUFReader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _dequantize_all(reader: gguf.GGUFReader, path: Path) -> dict[str, torch.Tensor]:
    def one(t: gguf.ReaderTensor) -> tuple[str, torch.Tensor]:
        array = gguf.quants.dequantize(t.data, t.tensor_type)
        # GGUF lists dims innermost first; numpy (rows, cols) is HF's [out, in].
        shape = tuple(int(d) for d in reversed(t.shape))
        # F32 tensors come back as read-only views of the mmap; copy those only.
        array = np.require(array.reshape(shape), np.float32, ["C", "W"])
        return t.name, torch.from_numpy(array)

    try:
        # numpy releases the GIL in the dequant kernels, so threads overlap the big tensors.
        with ThreadPoolExecutor() as pool:
            return dict(pool.map(one, reader.tensors))
    except (ValueError, NotImplementedError) as e:
        raise ValueError(f"{path}: cannot dequantize tensors: {e}") from e


def _hf_name(gguf_name: str, path: Path) -> str:
    parts = gguf_name.split(".")
    if len(parts) == 2 and parts[0] in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{BLOCK_NAMES[parts[2]]}.{parts[3]}"
    raise ValueError(f"{path}: tensor {gguf_name!r} has no place in a Llama-family model")


def _unpermute_rope(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row interleave (as transformers' `_reverse_permute_weights` does)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape).contiguous()


def _config(
    reader: gguf.GGUFReader, arch: str, tensors: dict[str, torch.Tensor], path: Path
) -> ModelConfig:
    def meta(key: str, default=None):
        value = _field(reader, f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return value

    tokens = _field(reader, "tokenizer.ggml.tokens")
    if tokens is None:
        raise ValueError(f"{path}: GGUF file has no tokenizer (tokenizer.ggml.tokens)")
    hidden, heads = int(meta("embedding_length")), int(meta("attention.head_count"))
    head_dim = int(meta("attention.key_length", hidden // heads))
    if int(meta("rope.dimension_count", head_dim)) != head_dim:
        raise ValueError(f"{path}: partial rotary embeddings are not supported")
    rope_theta = float(meta("rope.freq_base", 10000.0))
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    turn_ends = turn_end_token_ids(
        {t: i for i, t in enumerate(tokens)}, _field(reader, "tokenizer.chat_template")
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
        rope_scaling=_rope_scaling(reader, arch, tensors, rope_theta, head_dim, path),
        # Qwen2 has q/k/v biases and Qwen3 per-head q/k norms; the tensors say which is here.
        attention_bias="blk.0.attn_q.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(dict.fromkeys(([eos] if eos is not None else []) + list(turn_ends))),
        name=path.name,
    )


def _rope_scaling(
    reader: gguf.GGUFReader,
    arch: str,
    tensors: dict[str, torch.Tensor],
    rope_theta: float,
    head_dim: int,
    path: Path,
) -> dict | None:
    """HF-style rope_scaling from the GGUF metadata, or from the llama3 `rope_freqs` tensor."""
    if ROPE_FREQS in tensors:
        return _llama3_from_rope_freqs(tensors[ROPE_FREQS].numpy(), rope_theta, head_dim, path)
    kind = _field(reader, f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind not in ("linear", "yarn"):
        raise ValueError(f"{path}: rope scaling type {kind!r} is not supported")
    scaling = {"rope_type": kind, "factor": float(_field(reader, f"{arch}.rope.scaling.factor"))}
    original = _field(reader, f"{arch}.rope.scaling.original_context_length")
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


def _tokenizer(reader: gguf.GGUFReader, path: Path):
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:  # transformers raises many types for a tokenizer it cannot convert
        raise ValueError(f"{path}: cannot build a tokenizer from the GGUF metadata: {e}") from e
    # Older transformers versions drop the template when converting a GGUF tokenizer.
    if tokenizer.chat_template is None:
        tokenizer.chat_template = _field(reader, "tokenizer.chat_template")
    return tokenizer
