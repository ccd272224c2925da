"""What every format loader returns (LoadedModel) and checks before it returns.

Below the loaders (engine.model.gguf.loader, engine.model.hf_loader) and the dispatch over them
(engine.model.loader), which all use it: none of them imports another for these names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from kvscope.engine.model.model_config import ModelConfig
from kvscope.engine.model.weight_source import Weight, WeightSource, materialize

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

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
    tokenizer: PreTrainedTokenizerBase  # with a chat template
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
    ) -> dict[str, Weight]:
        """Every weight, read now (dequantized to `dtype` by default)."""
        return {n: self.weights.read(n, quantization, dtype) for n in self.weights.shapes()}


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
