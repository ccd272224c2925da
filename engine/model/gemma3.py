"""The Gemma 3 (text) forward: Llama's layer loop with Gemma's norms, MLP, scales and ropes.

What differs from Llama, as transformers' modeling_gemma3.py and llama.cpp's gemma3 graph do it:

    embeddings    scaled by sqrt(hidden), the scale rounded to the activation dtype first
    RMSNorm       x * (1 + w), the product taken in float32 and cast after (Llama casts before);
                  the weights are kept as 1 + w in float32, added once at load
    layer         input norm -> attention -> post-attention norm -> residual,
                  pre-FFN norm -> GELU-tanh gated MLP -> post-FFN norm -> residual
    attention     q/k norms per head; scale query_pre_attn_scalar ** -0.5; sliding layers use
                  their own rope base (rope_local_theta) and no rope scaling, full layers use
                  rope_theta and rope_scaling
    logits        soft-capped (cap * tanh(logits / cap)) when the config says so

Relies on engine/model/llama.py (helper D's sliding-window work edits it too):
LlamaModel.forward's loop and its hooks `layer_class`, `embed_tokens`, `step_rotary`,
`final_norm`; DecoderLayer.__init__ (q/k/v, o, gate/up, down, input/post-attention and q/k
norms, `sliding_window` from cfg.layer_window), DecoderLayer.attend (the paged_attention call)
and DecoderLayer.norm / vectors.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kvscope.engine.model.attention import AttentionMetadata
from kvscope.engine.model.llama import DecoderLayer, LlamaModel, _Reader
from kvscope.engine.model.model_config import ModelConfig
from kvscope.engine.model.rope import RotaryEmbedding

GELU_TANH = "gelu_pytorch_tanh"


def gemma_rms_norm(x: torch.Tensor, weight_plus_one: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma3RMSNorm: statistics and the weight product in float32, cast back last."""
    x32 = x.float()
    return F.rms_norm(x32, weight_plus_one.shape, weight_plus_one, eps).to(x.dtype)


def plus_one(weight: torch.Tensor) -> torch.Tensor:
    """An HF Gemma norm weight w as the multiplier 1 + w, in float32 (as HF computes it)."""
    return 1.0 + weight.float()


class Gemma3DecoderLayer(DecoderLayer):
    def __init__(self, cfg: ModelConfig, read: _Reader, prefix: str) -> None:
        super().__init__(cfg, read, prefix)
        self.pre_ffn_norm = read(f"{prefix}.pre_feedforward_layernorm.weight", "vector")
        self.post_ffn_norm = read(f"{prefix}.post_feedforward_layernorm.weight", "vector")
        self.input_norm = plus_one(self.input_norm)
        self.post_norm = plus_one(self.post_norm)
        # Gemma 3 always norms q and k (its config fields set qk_norm).
        assert self.q_norm is not None and self.k_norm is not None
        self.q_norm = plus_one(self.q_norm)
        self.k_norm = plus_one(self.k_norm)
        self.pre_ffn_norm = plus_one(self.pre_ffn_norm)
        self.post_ffn_norm = plus_one(self.post_ffn_norm)
        self.scale = (cfg.query_pre_attn_scalar or cfg.head_dim) ** -0.5

    def vectors(self) -> list[torch.Tensor]:
        return [*super().vectors(), self.pre_ffn_norm, self.post_ffn_norm]

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return gemma_rms_norm(x, weight, self.cfg.rms_norm_eps)

    def __call__(
        self,
        h: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        kv_scales: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None),
    ) -> torch.Tensor:
        x = self.norm(h, self.input_norm)
        attn = self.o_proj(self.attend(x, rope, k_cache, v_cache, meta, kv_scales))
        h = h + self.norm(attn, self.post_norm)
        x = self.norm(h, self.pre_ffn_norm)
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        mlp = self.down(F.gelu(gate, approximate="tanh") * up)
        return h + self.norm(mlp, self.post_ffn_norm)


class Gemma3Model(LlamaModel):
    layer_class = Gemma3DecoderLayer

    def __init__(self, cfg: ModelConfig, *args: Any, **kwargs: Any) -> None:
        """LlamaModel's arguments, passed through unchanged."""
        check_gemma3_config(cfg)
        super().__init__(cfg, *args, **kwargs)
        dtype, device = self.dtype, self.device
        self.norm = plus_one(self.norm)
        # HF multiplies by the scale cast to the weights' dtype: 25.25 in bf16 for hidden 640.
        self.embed_scale = torch.tensor(cfg.hidden_size**0.5, dtype=dtype, device=device)
        local_theta = cfg.rope_local_theta or cfg.rope_theta
        # Sliding layers: their own base and no scaling (transformers' rope_parameters
        # ["sliding_attention"], llama.cpp's rope_freq_base_train_swa / freq_scale 1).
        self.local_rope = RotaryEmbedding(
            cfg.head_dim, self.rope.max_position, local_theta, None, device
        )
        self.sliding = [layer.sliding_window is not None for layer in self.layers]

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed(input_ids) * self.embed_scale

    def step_rotary(self, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        full = self.rope.cos_sin(positions)
        local = self.local_rope.cos_sin(positions) if any(self.sliding) else full
        return [local if sliding else full for sliding in self.sliding]

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return gemma_rms_norm(h, self.norm, self.cfg.rms_norm_eps)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        cap = self.cfg.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap


def check_gemma3_config(cfg: ModelConfig) -> None:
    """What this forward does not implement is refused here rather than run wrong."""
    if cfg.hidden_activation != GELU_TANH:
        raise ValueError(
            f"{cfg.name}: Gemma 3 hidden_activation {cfg.hidden_activation!r} is not supported "
            f"(only {GELU_TANH})"
        )
