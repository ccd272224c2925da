"""GGUF file -> ModelConfig + a streaming weight source under HF names + HF tokenizer.

Quantized tensors stay quantized (`kernels.quant_format`); reading converts one tensor at a
time, a few rows at a time, straight from the file's blocks (`engine.quant.gguf_blocks`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from io import BufferedReader
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from gguf.constants import GGML_QUANT_SIZES
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from kvscope.engine.input_file import check_input_file
from kvscope.engine.memory.model_too_large import ModelTooLargeError
from kvscope.engine.model import gemma3_config
from kvscope.engine.model.config_limits import check_layer_count, check_sizes
from kvscope.engine.model.gguf.file import GGUFFile, GGUFTensor
from kvscope.engine.model.gguf.identity import name_fields
from kvscope.engine.model.gguf.rope import gguf_rope_scaling
from kvscope.engine.model.gguf.split import read_gguf_model
from kvscope.engine.model.loaded_model import LoadedModel, check_weights, turn_end_token_ids
from kvscope.engine.model.model_config import ModelConfig
from kvscope.engine.model.remote_code import refuse_remote_code
from kvscope.engine.model.templates.fallbacks import builtin_chat_template, ensure_chat_template
from kvscope.engine.model.tokenizer_cache import cached_tokenizer
from kvscope.engine.model.weight_source import Weight, finish, read_exact
from kvscope.engine.quant.gguf_blocks import (
    DENSE_TYPES,
    SUPPORTED_QUANT_TYPES,
    Q,
    _halves_or_f32,
    decode_blocks,
    to_quantized_tensor,
)
from kvscope.kernels.quant_format import QuantizedTensor

# llama.cpp writes Mistral checkpoints as "llama"; Qwen2/Qwen3 keep their own name.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
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
# Gemma 3 norms around both sublayers: llama.cpp's ffn_norm is the pre-MLP norm there.
GEMMA3_BLOCK_NAMES = {
    **BLOCK_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# llama.cpp's Gemma converters store every norm weight as 1 + w (HF keeps w); read back as w.
NORM_SHIFTED_ARCHITECTURES = ("gemma3",)
ROPE_FREQS = "rope_freqs.weight"
# Rows decoded per step: bounds the numpy scratch of one conversion (~16 MiB of codes).
CHUNK_ELEMENTS = 1 << 24
_DENSE_NUMPY: dict[Q, np.dtype[np.generic]] = {
    Q.F32: np.dtype("<f4"),
    Q.F16: np.dtype("<f2"),
    Q.BF16: np.dtype("<u2"),
}


def load_gguf(path: Path, progress: Callable[[str], None] | None = None) -> LoadedModel:
    """`progress(line)` hears of the slow steps (a first tokenizer conversion) as they start."""
    path = Path(path)
    check_input_file(path, "GGUF file")  # a missing file, a folder, a device: said as such
    gguf_file = read_gguf_model(path)
    path = gguf_file.path  # a split model's first part: its metadata is the model's
    metadata = gguf_file.metadata
    arch = _architecture(metadata, path)
    check_tensor_types(gguf_file)
    config = gguf_config(gguf_file)  # sizes checked here, before anything is sized by them
    row_orders = _rope_row_orders(gguf_file, arch) if arch in PERMUTED_QK_ARCHITECTURES else {}
    source = GGUFSource(gguf_file, row_orders)
    check_weights(config, source.shapes(), str(path))
    tokenizer = _tokenizer(metadata, path, progress)
    # None of its own: a plain transcript for a base model, else its family's (chat_templates).
    ensure_chat_template(tokenizer, arch, [path.stem, *name_fields(metadata).values()])
    return LoadedModel(config, source, tokenizer, source=str(path), kind="gguf")


def gguf_config(gguf_file: GGUFFile) -> ModelConfig:
    """The ModelConfig from the header alone; of the tensors only a llama3 `rope_freqs` is read."""
    arch = _architecture(gguf_file.metadata, gguf_file.path)
    names = {t.name for t in gguf_file.tensors}
    rope_freqs = next((t for t in gguf_file.tensors if t.name == ROPE_FREQS), None)
    freqs = None
    if rope_freqs is not None:
        if rope_freqs.qtype != Q.F32:
            raise ValueError(f"{gguf_file.path}: {ROPE_FREQS} is {rope_freqs.qtype.name}, not F32")
        freqs = np.array(rope_freqs.data, dtype=np.float32).reshape(-1)
    return _config(gguf_file.metadata, arch, names, freqs, gguf_file.path)


def check_tensor_types(gguf_file: GGUFFile) -> None:
    """Refuse, before reading any data, a tensor type the engine cannot run."""
    known = (*SUPPORTED_QUANT_TYPES, *DENSE_TYPES)
    for t in gguf_file.tensors:
        if t.qtype not in known:
            raise ValueError(
                f"{gguf_file.path}: tensor {t.name!r} has type {t.qtype.name}, which KVScope "
                f"cannot run (supported: {', '.join(q.name for q in known)})"
            )
        if t.qtype in SUPPORTED_QUANT_TYPES and len(t.shape) != 2:
            raise ValueError(
                f"{gguf_file.path}: tensor {t.name!r} is a {len(t.shape)}-D {t.qtype.name} "
                "tensor; only matrices are expected to be quantized"
            )


class GGUFSource:
    """A GGUF file's tensors under HF names, read and converted one at a time."""

    def __init__(self, gguf_file: GGUFFile, row_orders: dict[str, np.ndarray]) -> None:
        self.path = gguf_file.path
        self.row_orders = row_orders
        arch = gguf_file.metadata.get("general.architecture")
        self.norm_shift = arch in NORM_SHIFTED_ARCHITECTURES
        self.tensors: dict[str, GGUFTensor] = {
            _hf_name(t.name, self.path, arch): t for t in gguf_file.tensors if t.name != ROPE_FREQS
        }

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: t.shape for name, t in self.tensors.items()}

    def kinds(self) -> dict[str, str]:
        return {name: t.qtype.name for name, t in self.tensors.items()}

    def read(self, name: str, quantization: str, dtype: torch.dtype) -> Weight:
        t = self.tensors[name]
        with open(t.file or self.path, "rb") as f:
            if t.qtype in DENSE_TYPES:
                raw = read_exact(f, t.offset, t.nbytes).view(_DENSE_NUMPY[t.qtype])
                raw = raw.reshape(t.shape)
                order = self.row_orders.get(t.name)
                tensor = torch.from_numpy(raw if order is None else raw[order])
                if t.qtype == Q.BF16:
                    tensor = tensor.view(torch.bfloat16)
                if self.norm_shift and name.endswith("norm.weight"):
                    tensor = tensor.float() - 1.0  # as transformers' Gemma2TensorProcessor
                return finish(tensor, name, quantization, dtype)
            return finish(self._quantized(f, t), name, quantization, dtype)

    def _quantized(self, f: BufferedReader, t: GGUFTensor) -> QuantizedTensor:
        n, k = t.shape
        block, type_size = GGML_QUANT_SIZES[t.qtype]
        row_bytes = k // block * type_size
        order = self.row_orders.get(t.name)
        whole: npt.NDArray[np.uint8] | None = None
        if order is not None:  # a permuted q/k matrix: read it whole, reorder its rows
            whole = read_exact(f, t.offset, t.nbytes).reshape(n, row_bytes)[order]
        step = max(1, CHUNK_ELEMENTS // k)
        parts: dict[str, torch.Tensor | None] = {}
        meta: dict[str, object] = {}
        for start in range(0, n, step):
            stop = min(n, start + step)
            if whole is not None:
                raw = whole[start:stop]
            else:
                raw = read_exact(f, t.offset + start * row_bytes, (stop - start) * row_bytes)
                raw = raw.reshape(stop - start, row_bytes)
            chunk = decode_blocks(raw, t.qtype, k)
            if not parts:
                meta = {key: chunk[key] for key in ("bits", "group_size", "super_group_size")}
                for key in ("codes", "d", "dmin", "sub_scale", "sub_min"):
                    value = chunk.get(key)
                    if value is None:
                        parts[key] = None
                        continue
                    # Scales are gathered in float32 and narrowed once at the end.
                    dt = np.float32 if key in ("d", "dmin") else value.dtype
                    parts[key] = torch.empty((n, value.shape[1]), dtype=_torch_dtype(dt))
            for key, value in parts.items():
                if value is not None:
                    value[start:stop] = torch.from_numpy(chunk[key].astype(value.numpy().dtype))
        arrays: dict[str, np.ndarray | None] = {}
        # Scales were gathered in float32 across chunks; narrowed once, as one decode would.
        for key in ("d", "dmin"):
            scales = parts[key]
            assert scales is not None  # every block format has both (decode_blocks)
            arrays[key] = _halves_or_f32(scales.numpy())
        for key in ("codes", "sub_scale", "sub_min"):
            gathered = parts[key]
            arrays[key] = None if gathered is None else gathered.numpy()
        return to_quantized_tensor({**arrays, **meta}, (n, k), t.qtype.name)


def _torch_dtype(dt: npt.DTypeLike) -> torch.dtype:
    return {
        np.dtype(np.uint8): torch.uint8,
        np.dtype(np.int8): torch.int8,
        np.dtype(np.float32): torch.float32,
    }[np.dtype(dt)]


def _architecture(metadata: dict[str, Any], path: Path) -> str:
    arch = metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{path}: GGUF architecture {arch!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return str(arch)


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


def _hf_name(gguf_name: str, path: Path, arch: str | None = None) -> str:
    parts = gguf_name.split(".")
    block_names = GEMMA3_BLOCK_NAMES if arch == "gemma3" else BLOCK_NAMES
    if len(parts) == 2 and parts[0] in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in block_names:
        return f"model.layers.{parts[1]}.{block_names[parts[2]]}.{parts[3]}"
    raise ValueError(f"{path}: tensor {gguf_name!r} has no place in a Llama-family model")


def _config(
    metadata: dict[str, Any],
    arch: str,
    names: set[str],
    rope_freqs: np.ndarray | None,
    path: Path,
) -> ModelConfig:
    def meta(key: str, default: object = None) -> Any:  # a header value: int, float, str...
        value = metadata.get(f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return value

    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ValueError(f"{path}: GGUF file has no tokenizer (tokenizer.ggml.tokens)")
    hidden, heads = meta("embedding_length"), meta("attention.head_count")
    check_sizes(
        str(path),
        hidden=(f"{arch}.embedding_length", hidden),
        heads=(f"{arch}.attention.head_count", heads),
        kv_heads=(f"{arch}.attention.head_count_kv", meta("attention.head_count_kv", heads)),
        layers=(f"{arch}.block_count", meta("block_count")),
        intermediate=(f"{arch}.feed_forward_length", meta("feed_forward_length")),
        context=(f"{arch}.context_length", meta("context_length")),
        vocab=("tokenizer.ggml.tokens", len(tokens)),
    )
    head_dim = meta("attention.key_length", hidden // heads)
    check_sizes(str(path), head_dim=(f"{arch}.attention.key_length", head_dim))
    layers = {
        int(n.split(".")[1])
        for n in names
        if n.startswith("blk.") and n.count(".") >= 2 and n.split(".")[1].isdigit()
    }
    check_layer_count(str(path), f"{arch}.block_count", meta("block_count"), layers)
    if int(meta("rope.dimension_count", head_dim)) != head_dim:
        raise ValueError(f"{path}: partial rotary embeddings are not supported")
    rope_theta = float(meta("rope.freq_base", 10000.0))
    eos = metadata.get("tokenizer.ggml.eos_token_id")
    template = metadata.get("tokenizer.chat_template") or builtin_chat_template(arch)
    turn_ends = turn_end_token_ids({t: i for i, t in enumerate(tokens)}, template)
    config = ModelConfig(
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
        tie_word_embeddings="output.weight" not in names,
        rope_scaling=gguf_rope_scaling(metadata, arch, rope_freqs, rope_theta, head_dim, path),
        # Qwen2 has q/k/v biases and Qwen3 per-head q/k norms; the tensors say which is here.
        attention_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(dict.fromkeys(([eos] if eos is not None else []) + list(turn_ends))),
        name=path.name,
    )
    if arch == "gemma3":
        fields = gemma3_config.gguf_fields(
            metadata, config.num_layers, hidden, heads, head_dim, path
        )
        return replace(config, **fields)
    return config


def _tokenizer(
    metadata: dict[str, Any], path: Path, progress: Callable[[str], None] | None = None
) -> PreTrainedTokenizerBase:
    def announce() -> None:
        if progress is not None:
            count = len(metadata.get("tokenizer.ggml.tokens", []))
            progress(f"Converting the tokenizer ({count:,} tokens; once per file)…")

    # The shipped conversion (the bundled model's, written at build time) comes first.
    tokenizer = cached_tokenizer(
        path, lambda: convert_tokenizer(metadata, path), announce, metadata=metadata
    )
    if progress is not None:
        progress("Loading the model…")
    return tokenizer


def convert_tokenizer(metadata: dict[str, Any], path: Path) -> PreTrainedTokenizerBase:
    """transformers' conversion of the file's tokenizer (seconds: it re-reads the whole file)."""
    try:
        # Never a model's own code: a folder can carry an auto_map and a .py beside the file.
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
            str(path.parent), gguf_file=path.name, trust_remote_code=False
        )
    except MemoryError as e:  # not the file's fault: say so, not "cannot build a tokenizer"
        raise ModelTooLargeError(
            f"{path}: ran out of host memory while converting its tokenizer "
            f"({len(metadata.get('tokenizer.ggml.tokens', [])):,} tokens); close other "
            "programs and try again"
        ) from e
    except Exception as e:  # transformers raises many types for a tokenizer it cannot convert
        refuse_remote_code(e, path.parent)
        raise ValueError(f"{path}: cannot build a tokenizer from the GGUF metadata: {e}") from e
    # Older transformers versions drop the template when converting a GGUF tokenizer.
    if tokenizer.chat_template is None:
        tokenizer.chat_template = metadata.get("tokenizer.chat_template")
    return tokenizer
