"""Synthetic GGUF files of real model shapes, for `kvscope bench --models`.

Random weights (they produce nonsense text, which is fine for memory and speed), the bundled
model's tokenizer and chat template, and the tensor types llama.cpp's Q4_K_M recipe writes:
Q4_K everywhere except the output head and, in every other layer, attn_v and ffn_down, which
get Q6_K (llama.cpp's "use more bits" rule puts them in about half the layers); or Q4_0 for
every matrix. Blocks are random bytes with small float16 scales: every bit pattern is a valid
block.
Files are cached under the user cache dir and rebuilt only when missing. The writer lives with
the engine: it reads the bundled model through the engine's GGUF reader, and the header it writes
is the one the engine's loader (and the tests' tiny GGUFs) rely on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from kvscope.engine.model.gguf.file import read_gguf
from kvscope.engine.model.loader import default_model_path

VERSION = 1  # bump when the recipe changes: cached files carry it in their name


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    context: int = 4096
    recipe: str = "Q4_K_M"  # or "Q4_0": every matrix Q4_0, as the model-size issue measured


SHAPES = {
    # TinyLlama-1.1B's body; the vocabulary is the bundled tokenizer's 49,152.
    "1.1B": Shape("1.1B", 22, 2048, 5632, 32, 4),
    # Llama-3.2-3B's body (28 layers there; 26 as measured in the model-size issue).
    "3B": Shape("3B", 26, 3072, 8192, 24, 8),
    # No Q6_K: the CPU keeps every matrix in torch's int4 layout.
    "1.1B-Q4_0": Shape("1.1B-Q4_0", 22, 2048, 5632, 32, 4, recipe="Q4_0"),
}


def synthetic_path(shape: Shape, cache_dir: Path) -> Path:
    body = f"{shape.layers}x{shape.hidden}x{shape.intermediate}"
    return cache_dir / f"synthetic-{shape.name}-{body}-{shape.recipe}-v{VERSION}.gguf"


def ensure_synthetic_gguf(shape: Shape, cache_dir: Path) -> Path:
    path = synthetic_path(shape, cache_dir)
    if path.is_file():
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    write_synthetic_gguf(shape, tmp)
    tmp.replace(path)
    return path


def write_synthetic_gguf(shape: Shape, path: Path, seed: int = 0) -> None:
    bundled = read_gguf(default_model_path())
    vocab = len(bundled.metadata["tokenizer.ggml.tokens"])
    head_dim = shape.hidden // shape.heads
    writer = gguf.GGUFWriter(path, "llama")
    add_shape_metadata(writer, shape, head_dim)
    for key, value in bundled.metadata.items():
        if key.startswith("tokenizer."):
            _copy_metadata(writer, key, value)
    rng = np.random.default_rng(seed)
    h, kv = shape.hidden, shape.kv_heads * head_dim
    base, more = ("Q4_0", "Q4_0") if shape.recipe == "Q4_0" else ("Q4_K", "Q6_K")
    _add(writer, "token_embd.weight", rng, base, vocab, h)
    writer.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    _add(writer, "output.weight", rng, more, vocab, h)
    for i in range(shape.layers):
        more_bits = more if i % 2 == 0 else base
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(h, dtype=np.float32))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(h, dtype=np.float32))
        _add(writer, p + "attn_q.weight", rng, base, h, h)
        _add(writer, p + "attn_k.weight", rng, base, kv, h)
        _add(writer, p + "attn_v.weight", rng, more_bits, kv, h)
        _add(writer, p + "attn_output.weight", rng, base, h, h)
        _add(writer, p + "ffn_gate.weight", rng, base, shape.intermediate, h)
        _add(writer, p + "ffn_up.weight", rng, base, shape.intermediate, h)
        _add(writer, p + "ffn_down.weight", rng, more_bits, h, shape.intermediate)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def add_shape_metadata(
    writer: gguf.GGUFWriter,
    shape: Shape,
    head_dim: int,
    rope_theta: float = 10000.0,
    rms_norm_eps: float = 1e-5,
) -> None:
    """The header keys that give a Llama-family GGUF its shape, as llama.cpp's converter names
    them (tests' tiny GGUFs write theirs with it too)."""
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(rope_theta)
    writer.add_layer_norm_rms_eps(rms_norm_eps)


def _copy_metadata(writer: gguf.GGUFWriter, key: str, value: object) -> None:
    if isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, list) and value and isinstance(value[0], str):
        writer.add_array(key, value)
    elif isinstance(value, list):
        array, int32 = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32
        writer.add_key_value(key, value, array, sub_type=int32)


def _add(
    writer: gguf.GGUFWriter,
    name: str,
    rng: np.random.Generator,
    qtype_name: str,
    rows: int,
    cols: int,
) -> None:
    """One random [rows, cols] matrix in `qtype_name`, written as raw blocks."""
    qtype = gguf.GGMLQuantizationType[qtype_name]
    block, type_size = gguf.constants.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows * cols // block, type_size), dtype=np.uint8)
    n = raw.shape[0]
    if qtype_name == "Q4_0":  # d first; weights d (q - 8)
        raw[:, 0:2] = np.full((n, 1), 0.05 / 8, np.float16).view(np.uint8)
    elif qtype_name == "Q4_K":  # d, dmin first; weights d sc q - dmin m up to ~0.05
        raw[:, 0:2] = np.full((n, 1), 0.05 / 63 / 15, np.float16).view(np.uint8)
        raw[:, 2:4] = np.full((n, 1), 0.025 / 63, np.float16).view(np.uint8)
    else:  # Q6_K: d last
        raw[:, -2:] = np.full((n, 1), 0.05 / 127 / 32, np.float16).view(np.uint8)
    raw = raw.reshape(rows, cols // block * type_size)
    writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
