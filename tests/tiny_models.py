"""Tiny random Llama-family checkpoints, as HF folders and as GGUF files, for fast tests."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from transformers import AutoTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

from kvscope.engine.bench.synthetic_gguf import Shape, add_shape_metadata
from kvscope.engine.model.loader import default_model_path

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
CONFIG_CLASSES = {
    "llama": transformers.LlamaConfig,
    "mistral": transformers.MistralConfig,
    "qwen2": transformers.Qwen2Config,
    "qwen3": transformers.Qwen3Config,
}
# Qwen2's small models tie the head to the embedding; the others here keep it separate.
TIED = {"llama": False, "mistral": False, "qwen2": True, "qwen3": False}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 128,
}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@functools.cache
def bundled_tokenizer():
    """The default model's tokenizer, converted from its GGUF once per test session (~5 s)."""
    path = default_model_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def tiny_config(arch: str, vocab_size: int, *, llama3_rope: bool = False, bos=1, eos=2):
    """2 layers, hidden 64, 4 query / 2 KV heads. Qwen3 (and llama3 rope) use head_dim 32."""
    extra: dict = {"head_dim": 32} if arch == "qwen3" else {}
    if llama3_rope:
        # head_dim 32 puts three frequencies on the llama3 ramp, enough to recover its params.
        extra = {"head_dim": 32, "rope_parameters": {"rope_theta": 10000.0, **LLAMA3_ROPE}}
    return CONFIG_CLASSES[arch](
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=TIED[arch],
        bos_token_id=bos,
        eos_token_id=eos,
        **extra,
    )


def random_model(config, seed: int) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Norms start at exactly 1 and biases at 0; randomize both so a dropped one fails a test.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_(1.0 if "norm" in name else 0.0, 0.1)
    return model.eval()


def make_tiny_model(
    arch: str,
    folder: Path,
    seed: int = 0,
    *,
    llama3_rope: bool = False,
    max_shard_size: str = "1GB",
    tokenizer=None,
) -> Path:
    """A complete HF model folder (config, safetensors, the bundled tokenizer); returns it.

    Pass `tokenizer` when a loaded default model already has it, to skip a ~5 s conversion.
    """
    tokenizer = bundled_tokenizer() if tokenizer is None else tokenizer
    config = tiny_config(
        arch,
        len(tokenizer),
        llama3_rope=llama3_rope,
        bos=tokenizer.bos_token_id,
        eos=tokenizer.eos_token_id,
    )
    folder = Path(folder)
    model = random_model(config, seed)
    model.save_pretrained(folder, safe_serialization=True, max_shard_size=max_shard_size)
    tokenizer.save_pretrained(folder)
    return folder


def make_tiny_gguf(
    arch: str, path: Path, seed: int = 0, *, llama3_rope: bool = False
) -> tuple[Path, dict[str, torch.Tensor]]:
    """A GGUF file laid out the way llama.cpp's converter writes one, plus its HF weights.

    The vocabulary is the 256 byte-level symbols plus three chat tokens, so the file stays small
    and its tokenizer converts in well under a second.
    """
    tokens = byte_tokens()
    bos, eos = tokens.index("<|im_start|>"), tokens.index("<|endoftext|>")
    config = tiny_config(arch, len(tokens), llama3_rope=llama3_rope, bos=bos, eos=eos)
    weights = random_model(config, seed).state_dict()
    gguf_arch = "llama" if arch == "mistral" else arch  # as llama.cpp does
    writer = gguf.GGUFWriter(path, gguf_arch)
    _write_metadata(writer, config)
    add_byte_tokenizer(writer, tokens)
    for name, tensor in weights.items():
        array = tensor.numpy()
        if gguf_arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
            array = _llama_cpp_permute(array, heads)
        writer.add_tensor(_gguf_name(name), array)
    if llama3_rope:
        writer.add_tensor("rope_freqs.weight", _llama_cpp_rope_freqs(config))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path), dict(weights)


def _write_metadata(writer: gguf.GGUFWriter, config) -> None:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    shape = Shape(
        "tiny",
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        context=config.max_position_embeddings,
    )
    add_shape_metadata(
        writer, shape, head_dim, config.rope_parameters["rope_theta"], config.rms_norm_eps
    )
    # Qwen3's head dim is not hidden / heads: the file says so, as llama.cpp's converter does.
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)


def _gguf_name(hf_name: str) -> str:
    names = {
        "model.embed_tokens": "token_embd",
        "model.norm": "output_norm",
        "lm_head": "output",
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
        "post_attention_layernorm": "ffn_norm",
    }
    stem, suffix = hf_name.rsplit(".", 1)
    if stem.startswith("model.layers."):
        _, _, layer, part = stem.split(".", 3)
        return f"blk.{layer}.{names[part]}.{suffix}"
    return f"{names[stem]}.{suffix}"


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf `LlamaModel.permute`: interleave q/k rows for its rope."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _llama_cpp_rope_freqs(config) -> np.ndarray:
    """llama.cpp's converter loop for llama3 rope: one divisor per rotary frequency."""
    rope = config.rope_parameters
    dim, base = config.head_dim, rope["rope_theta"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    old, factor = rope["original_max_position_embeddings"], rope["factor"]
    divisors = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * base ** (i / dim)
        if wavelen < old / high:
            divisors.append(1.0)
        elif wavelen > old / low:
            divisors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, dtype=np.float32)


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values, in byte order."""
    return [bytes_to_unicode()[b] for b in range(256)]


# ---- quantized GGUFs ------------------------------------------------------------------------
QUANT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def random_quant_blocks(qtype_name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Raw GGUF bytes of a [rows, cols] matrix in `qtype_name` with weights of about +-0.1.

    The legacy types go through gguf's own quantizer; K-quant blocks are built from random
    bytes (every bit pattern is a valid K-quant block) with small float16 super-scales."""
    qtype = gguf.GGMLQuantizationType[qtype_name]
    rng = np.random.default_rng(seed)
    if qtype_name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        floats = rng.normal(0, 0.05, size=(rows, cols)).astype(np.float32)
        return gguf.quants.quantize(floats, qtype)
    block, type_size = gguf.constants.GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // block
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)

    def halves(low: float, high: float) -> np.ndarray:
        return rng.uniform(low, high, size=(n_blocks, 1)).astype(np.float16).view(np.uint8)

    if qtype_name in ("Q4_K", "Q5_K"):  # d, dmin first; values d sc q - dmin m
        top = 15 if qtype_name == "Q4_K" else 31
        raw[:, 0:2] = halves(0.1 / 63 / top, 0.2 / 63 / top)
        raw[:, 2:4] = halves(0.05 / 63, 0.1 / 63)
    else:  # Q6_K: d last; values d sc (q - 32) with int8 sc
        raw[:, -2:] = halves(0.1 / 127 / 32, 0.2 / 127 / 32)
    return raw.reshape(rows, cols // block * type_size)


SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_tokens() -> list[str]:
    """The tiny files' vocabulary: the 256 byte-level symbols, one merge and the chat tokens."""
    return [*_byte_alphabet(), "hi", *SPECIAL_TOKENS]


def add_byte_tokenizer(
    writer: gguf.GGUFWriter, tokens: list[str], chat_template: str | None = CHAT_TEMPLATE
) -> tuple[int, int]:
    """The byte-level gpt2 tokenizer of `tokens` (byte_tokens(), maybe padded), its chat tokens
    typed as control; returns (bos, eos)."""
    bos, eos = tokens.index("<|im_start|>"), tokens.index("<|endoftext|>")
    special = {tokens.index(t) for t in SPECIAL_TOKENS}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in special else 1 for i in range(len(tokens))])  # 3 = control
    writer.add_token_merges(["h i"])
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    return bos, eos


def layer_matrices(
    num_layers: int, hidden: int, kv: int, inter: int, qtype_of
) -> dict[str, tuple[str, int, int]]:
    """{GGUF name: (quant type, rows, cols)} of a Llama's layer matrices; `qtype_of(name)`
    picks each one's type."""
    parts = (
        ("attn_q", hidden, hidden),
        ("attn_k", kv, hidden),
        ("attn_v", kv, hidden),
        ("attn_output", hidden, hidden),
        ("ffn_gate", inter, hidden),
        ("ffn_up", inter, hidden),
        ("ffn_down", hidden, inter),
    )
    matrices = {}
    for i in range(num_layers):
        for part, rows, cols in parts:
            name = f"blk.{i}.{part}"
            matrices[name] = (qtype_of(name), rows, cols)
    return matrices


def add_random_quant_tensors(
    writer: gguf.GGUFWriter,
    matrices: dict[str, tuple[str, int, int]],
    num_layers: int,
    hidden: int,
    seed: int,
) -> None:
    """`matrices` as random blocks of their quant types (random_quant_blocks), then the float32
    norms near 1 of `num_layers` layers."""
    for j, (name, (qtype, rows, cols)) in enumerate(matrices.items()):
        raw = random_quant_blocks(qtype, rows, cols, seed * 1000 + j)
        kind = gguf.GGMLQuantizationType[qtype]
        writer.add_tensor(f"{name}.weight", raw, raw_shape=raw.shape, raw_dtype=kind)
    rng = np.random.default_rng(seed)
    norms = ["output_norm"] + [
        f"blk.{i}.{n}" for i in range(num_layers) for n in ("attn_norm", "ffn_norm")
    ]
    for name in norms:
        writer.add_tensor(f"{name}.weight", rng.normal(1, 0.1, size=hidden).astype(np.float32))


def make_quant_gguf(
    path: Path, qtype_name: str, seed: int = 0, types: dict[str, str] | None = None
) -> Path:
    """A tiny Llama GGUF (2 layers, hidden 256: K-quants need rows of 256) whose matrices are
    all `qtype_name` and whose norms are float32; the byte-level vocabulary of make_tiny_gguf.
    `types` gives some matrices another type by their GGUF name's end ({"attn_v": "Q6_K"}, as
    llama.cpp's Q4_K_M recipe does)."""
    tokens = byte_tokens()
    bos, eos = tokens.index("<|im_start|>"), tokens.index("<|endoftext|>")
    config = tiny_config("llama", len(tokens), bos=bos, eos=eos)
    config.hidden_size, config.intermediate_size, config.head_dim = 256, 512, 64
    writer = gguf.GGUFWriter(path, "llama")
    _write_metadata(writer, config)
    add_byte_tokenizer(writer, tokens)
    h, inter, kv = 256, 512, config.num_key_value_heads * 64
    vocab = len(tokens) + (-len(tokens)) % 4  # whole rows; pad ids are never produced
    own = {"token_embd": qtype_name, "output": qtype_name}

    def qtype_of(name: str) -> str:
        return next((t for end, t in (types or {}).items() if name.endswith(end)), qtype_name)

    matrices = {name: (qtype_of(name), vocab, h) for name in own}
    matrices |= layer_matrices(config.num_hidden_layers, h, kv, inter, qtype_of)
    add_random_quant_tensors(writer, matrices, config.num_hidden_layers, h, seed)
    writer.add_vocab_size(vocab)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
