"""Llama GGUFs of a chosen size with a byte-level vocabulary, for memory tests.

engine/bench/synthetic_gguf.py writes real model shapes with the bundled 49k tokenizer, whose
first conversion takes seconds per file; these carry tests/tiny_models.py's 260-token byte
vocabulary instead (converted in well under a second), and llama.cpp's Q4_K_M mix (Q4_K, with
Q6_K for the head and every other layer's attn_v and ffn_down), so the CPU keeps them in the
same quantized layouts, and runs them on the same fused decode path, as the bundled model.
"""

from __future__ import annotations

from pathlib import Path

import gguf
from tiny_models import add_byte_tokenizer, add_random_quant_tensors, byte_tokens, layer_matrices

from kvscope.engine.bench.synthetic_gguf import Shape, add_shape_metadata

HEAD_DIM = 64


def sized_shape(name: str, layers: int, hidden: int, intermediate: int) -> Shape:
    """A Llama body with 64-wide heads, four query heads per KV head (hidden: 256s)."""
    heads = hidden // HEAD_DIM
    return Shape(name, layers, hidden, intermediate, heads, max(1, heads // 4), context=2048)


def write_sized_gguf(path: Path, shape: Shape, seed: int = 0) -> Path:
    tokens = byte_tokens()
    writer = gguf.GGUFWriter(path, "llama")
    add_shape_metadata(writer, shape, HEAD_DIM, rms_norm_eps=1e-6)
    add_byte_tokenizer(writer, tokens)
    h, kv, inter = shape.hidden, shape.kv_heads * HEAD_DIM, shape.intermediate
    vocab = len(tokens) + (-len(tokens)) % 4  # whole rows; pad ids are never produced

    def qtype_of(name: str) -> str:  # llama.cpp's Q4_K_M: V and down in Q6_K every other layer
        more = "Q6_K" if int(name.split(".")[1]) % 2 == 0 else "Q4_K"
        return more if name.endswith(("attn_v", "ffn_down")) else "Q4_K"

    matrices = {"token_embd": ("Q4_K", vocab, h), "output": ("Q6_K", vocab, h)}
    matrices |= layer_matrices(shape.layers, h, kv, inter, qtype_of)
    add_random_quant_tensors(writer, matrices, shape.layers, h, seed)
    writer.add_vocab_size(vocab)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
