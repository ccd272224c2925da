"""Tiny random Gemma 3 checkpoints (an HF folder and a llama.cpp-style GGUF) for fast tests.

Seven layers with pattern 6: layers 0-4 and 6 slide, layer 5 is full, so both kinds (and a
sliding layer after the full one) run. The window (8) is shorter than the test prompts. The
vocabulary is the 256 byte-level symbols plus Gemma's special tokens, so the tokenizer is built
in code in milliseconds, not converted.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
WINDOW = 8


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE: specials 0-4 (pad, eos, bos, turn start/end), the bytes, one merge."""
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for symbol in bytes_to_unicode().values():
        vocab[symbol] = len(vocab)
    vocab["hi"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("h", "i")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )


def tiny_config(vocab_size: int, **overrides) -> transformers.Gemma3TextConfig:
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=7,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        query_pre_attn_scalar=24,  # not head_dim: a scale taken from the wrong field fails
        sliding_window=WINDOW,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=True,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
        },
    )
    kwargs.update(overrides)
    return transformers.Gemma3TextConfig(**kwargs)


def random_gemma3(config, seed: int) -> transformers.Gemma3ForCausalLM:
    torch.manual_seed(seed)
    model = transformers.Gemma3ForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # Gemma norms start at 0 (multiplier 1): randomize them
                p.normal_(0.0, 0.3)
            else:
                p.normal_(0.0, 0.15)
    return model.eval()


def make_tiny_gemma3(folder: Path, seed: int = 0, **overrides) -> Path:
    """An HF folder: config.json, model.safetensors and the tiny tokenizer (no chat template)."""
    tokenizer = tiny_tokenizer()
    model = random_gemma3(tiny_config(len(tokenizer), **overrides), seed)
    folder = Path(folder)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def make_tiny_gemma3_gguf(path: Path, seed: int = 0, quantize_embedding: bool = False) -> Path:
    """The same kind of model written as llama.cpp's Gemma3Model converter writes it: norms
    stored as 1 + w, no q/k permutation, no output.weight (tied), no chat template, no
    layer pattern in the header. `quantize_embedding` stores token_embd as Q8_0."""
    tokenizer = tiny_tokenizer()
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    # A rope-scaling-free config: transformers' GGUF loader does not read rope scaling keys.
    config = tiny_config(
        len(vocab),
        query_pre_attn_scalar=32,  # what llama.cpp assumes (head_dim) for a non-27B file
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        },
    )
    weights = random_gemma3(config, seed).state_dict()
    writer = gguf.GGUFWriter(path, "gemma3")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_sliding_window(WINDOW)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocab)
    writer.add_token_types([3] * len(SPECIAL_TOKENS) + [1] * (len(vocab) - len(SPECIAL_TOKENS)))
    writer.add_token_merges(["h i"])  # transformers' converter needs one merge at least
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_pad_token_id(0)
    for name, tensor in weights.items():
        if name == "lm_head.weight":
            continue  # tied: llama.cpp writes no output tensor
        array = tensor.numpy().astype(np.float32)
        if name.endswith("norm.weight"):
            array = array + 1.0
        gname = _gguf_name(name)
        if quantize_embedding and gname == "token_embd.weight":
            q = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(gname, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(gname, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def _gguf_name(hf_name: str) -> str:
    stem, suffix = hf_name.rsplit(".", 1)
    if stem == "model.embed_tokens":
        return f"token_embd.{suffix}"
    if stem == "model.norm":
        return f"output_norm.{suffix}"
    _, _, layer, part = stem.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[part]}.{suffix}"
