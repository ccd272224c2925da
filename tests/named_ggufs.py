"""Tiny Llama GGUF files that say what real downloads say about themselves: general.name,
general.finetune, general.file_type, a chat template or none, and llama.cpp's Q4_K_M mix (the
layers in Q4_K, a large embedding in Q8_0). Also a fake Ollama folder around such a file.

Built from the pieces of tests/tiny_models.py; the byte-level vocabulary converts to a
tokenizer in well under a second, so these files load in tests.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gguf
import numpy as np
from tiny_models import (
    CHAT_TEMPLATE,
    _byte_alphabet,
    _write_metadata,
    random_quant_blocks,
    tiny_config,
)

Q4_K_M = int(gguf.LlamaFileType.MOSTLY_Q4_K_M)


def make_named_gguf(
    path: Path,
    *,
    name: str | None = None,
    finetune: str | None = None,
    file_type: int | None = Q4_K_M,
    chat_template: str | None = CHAT_TEMPLATE,
    layer_type: str = "Q4_K",
    embed_type: str = "Q8_0",
    extra_vocab: int = 0,
    seed: int = 0,
) -> Path:
    """A 2-layer hidden-256 Llama GGUF. `extra_vocab` pads the vocabulary with plain tokens so
    the embedding outweighs the layers, as in Gemma 3 270M (262k tokens x 640)."""
    tokens = [*_byte_alphabet(), "hi", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens += [f"tok{i}" for i in range(extra_vocab)]
    tokens += [f"pad{i}" for i in range((-len(tokens)) % 32)]  # whole quant blocks of rows
    bos, eos = tokens.index("<|im_start|>"), tokens.index("<|endoftext|>")
    config = tiny_config("llama", len(tokens), bos=bos, eos=eos)
    config.hidden_size, config.intermediate_size, config.head_dim = 256, 512, 64
    writer = gguf.GGUFWriter(path, "llama")
    if name is not None:
        writer.add_name(name)
    if finetune is not None:
        writer.add_finetune(finetune)
    if file_type is not None:
        writer.add_file_type(file_type)
    _write_metadata(writer, config)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    special = {tokens.index(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    writer.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    writer.add_token_merges(["h i"])
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    h, inter, kv = 256, 512, config.num_key_value_heads * 64
    matrices = {"token_embd": (len(tokens), h, embed_type)}
    for i in range(config.num_hidden_layers):
        matrices |= {
            f"blk.{i}.attn_q": (h, h, layer_type),
            f"blk.{i}.attn_k": (kv, h, layer_type),
            f"blk.{i}.attn_v": (kv, h, layer_type),
            f"blk.{i}.attn_output": (h, h, layer_type),
            f"blk.{i}.ffn_gate": (inter, h, layer_type),
            f"blk.{i}.ffn_up": (inter, h, layer_type),
            f"blk.{i}.ffn_down": (h, inter, layer_type),
        }
    rng = np.random.default_rng(seed)
    for j, (tensor, (rows, cols, qtype)) in enumerate(matrices.items()):
        raw = random_quant_blocks(qtype, rows, cols, seed * 1000 + j)
        kind = gguf.GGMLQuantizationType[qtype]
        writer.add_tensor(f"{tensor}.weight", raw, raw_shape=raw.shape, raw_dtype=kind)
    norms = ["output_norm"] + [
        f"blk.{i}.{n}" for i in range(config.num_hidden_layers) for n in ("attn_norm", "ffn_norm")
    ]
    for norm in norms:
        writer.add_tensor(f"{norm}.weight", rng.normal(1, 0.1, size=h).astype(np.float32))
    writer.add_vocab_size(len(tokens))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def add_to_ollama(
    models_dir: Path, gguf_path: Path, model: str, tag: str, namespace: str = "library"
) -> Path:
    """Store `gguf_path` as Ollama does: blobs/sha256-<hex> and a manifest naming it (with the
    template and params layers a real pull has). Returns the blob."""
    data = gguf_path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    blobs = models_dir / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    blob = blobs / f"sha256-{digest}"
    blob.write_bytes(data)
    template = b"{{ .Prompt }}"
    template_digest = hashlib.sha256(template).hexdigest()
    (blobs / f"sha256-{template_digest}").write_bytes(template)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "digest": "sha256:" + "0" * 64,
            "size": 2,
        },
        "layers": [
            {
                "mediaType": "application/vnd.ollama.image.model",
                "digest": f"sha256:{digest}",
                "size": len(data),
            },
            {
                "mediaType": "application/vnd.ollama.image.template",
                "digest": f"sha256:{template_digest}",
                "size": len(template),
            },
        ],
    }
    path = models_dir / "manifests" / "registry.ollama.ai" / namespace / model / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest), encoding="utf-8")
    return blob
