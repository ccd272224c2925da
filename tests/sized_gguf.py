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
import numpy as np
from tiny_models import CHAT_TEMPLATE, _byte_alphabet, random_quant_blocks

from engine.bench.synthetic_gguf import Shape, add_shape_metadata

HEAD_DIM = 64


def sized_shape(name: str, layers: int, hidden: int, intermediate: int) -> Shape:
    """A Llama body with 64-wide heads, four query heads per KV head (hidden: 256s)."""
    heads = hidden // HEAD_DIM
    return Shape(name, layers, hidden, intermediate, heads, max(1, heads // 4), context=2048)


def write_sized_gguf(path: Path, shape: Shape, seed: int = 0) -> Path:
    tokens = [*_byte_alphabet(), "hi", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bos, eos = tokens.index("<|im_start|>"), tokens.index("<|endoftext|>")
    writer = gguf.GGUFWriter(path, "llama")
    add_shape_metadata(writer, shape, HEAD_DIM, rms_norm_eps=1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 3) + [3] * 3)  # 3 = control
    writer.add_token_merges(["h i"])
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_chat_template(CHAT_TEMPLATE)
    h, kv, inter = shape.hidden, shape.kv_heads * HEAD_DIM, shape.intermediate
    vocab = len(tokens) + (-len(tokens)) % 4  # whole rows; pad ids are never produced
    matrices = {"token_embd": ("Q4_K", vocab, h), "output": ("Q6_K", vocab, h)}
    for i in range(shape.layers):
        more = "Q6_K" if i % 2 == 0 else "Q4_K"
        matrices |= {
            f"blk.{i}.attn_q": ("Q4_K", h, h),
            f"blk.{i}.attn_k": ("Q4_K", kv, h),
            f"blk.{i}.attn_v": (more, kv, h),
            f"blk.{i}.attn_output": ("Q4_K", h, h),
            f"blk.{i}.ffn_gate": ("Q4_K", inter, h),
            f"blk.{i}.ffn_up": ("Q4_K", inter, h),
            f"blk.{i}.ffn_down": (more, h, inter),
        }
    for j, (name, (qtype, rows, cols)) in enumerate(matrices.items()):
        raw = random_quant_blocks(qtype, rows, cols, seed * 1000 + j)
        kind = gguf.GGMLQuantizationType[qtype]
        writer.add_tensor(f"{name}.weight", raw, raw_shape=raw.shape, raw_dtype=kind)
    norms = ["output_norm"] + [
        f"blk.{i}.{n}" for i in range(shape.layers) for n in ("attn_norm", "ffn_norm")
    ]
    rng = np.random.default_rng(seed)
    for name in norms:
        writer.add_tensor(f"{name}.weight", rng.normal(1, 0.1, size=h).astype(np.float32))
    writer.add_vocab_size(vocab)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
