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
from tiny_models import (
    CHAT_TEMPLATE,
    _write_metadata,
    add_byte_tokenizer,
    add_random_quant_tensors,
    byte_tokens,
    layer_matrices,
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
    tokens = byte_tokens()
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
    add_byte_tokenizer(writer, tokens, chat_template)
    h, inter, kv = 256, 512, config.num_key_value_heads * 64
    matrices = {"token_embd": (embed_type, len(tokens), h)}
    matrices |= layer_matrices(config.num_hidden_layers, h, kv, inter, lambda _: layer_type)
    add_random_quant_tensors(writer, matrices, config.num_hidden_layers, h, seed)
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
