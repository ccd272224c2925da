"""The Llama-family forward (Llama, Mistral, Qwen2, Qwen3) over a paged KV cache.

Tokens arrive flat ([T]) from many sequences at once; attention reads and writes K/V only through
the block tables in AttentionMetadata. q/k/v and gate/up projections are fused into one matmul
each: fewer, larger GEMMs are what a CPU (and a GPU at small batch) rewards. Layer weights are
kept transposed ([in, out], contiguous): on CPU `x @ w` then runs up to 3x faster than
`F.linear` at decode batch sizes (measured on 2 cores: 213 vs 620 us per layer at batch 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kv.kv_cache import KVCache
from engine.model.attention import AttentionMetadata, paged_attention
from engine.model.model_config import ModelConfig
from engine.model.rope import RotaryEmbedding, apply_rotary


def _t(w: torch.Tensor) -> torch.Tensor:
    return w.t().contiguous()


def _matmul(x: torch.Tensor, w_t: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.addmm(bias, x, w_t) if bias is not None else x @ w_t


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)  # fused; bit-identical to the below here
    # float32 statistics, cast back before the weight: the exact order HF's LlamaRMSNorm uses.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


class DecoderLayer:
    def __init__(self, cfg: ModelConfig, w: dict[str, torch.Tensor], prefix: str) -> None:
        self.cfg = cfg
        attn = f"{prefix}.self_attn"
        self.input_norm = w[f"{prefix}.input_layernorm.weight"]
        self.post_norm = w[f"{prefix}.post_attention_layernorm.weight"]
        self.qkv = _t(torch.cat([w[f"{attn}.{p}_proj.weight"] for p in "qkv"], dim=0))
        self.qkv_bias = (
            torch.cat([w[f"{attn}.{p}_proj.bias"] for p in "qkv"]) if cfg.attention_bias else None
        )
        self.o_proj = _t(w[f"{attn}.o_proj.weight"])
        self.q_norm = w.get(f"{attn}.q_norm.weight") if cfg.qk_norm else None
        self.k_norm = w.get(f"{attn}.k_norm.weight") if cfg.qk_norm else None
        self.gate_up = _t(
            torch.cat([w[f"{prefix}.mlp.gate_proj.weight"], w[f"{prefix}.mlp.up_proj.weight"]])
        )
        self.down = _t(w[f"{prefix}.mlp.down_proj.weight"])
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.scale = cfg.head_dim**-0.5

    def __call__(
        self,
        h: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        kv_scales: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None),
    ) -> torch.Tensor:
        cfg = self.cfg
        t = h.shape[0]
        x = rms_norm(h, self.input_norm, cfg.rms_norm_eps)
        qkv = _matmul(x, self.qkv, self.qkv_bias)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, cfg.num_heads, cfg.head_dim)
        k = k.view(t, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(t, cfg.num_kv_heads, cfg.head_dim)
        if self.q_norm is not None:
            q = rms_norm(q, self.q_norm, cfg.rms_norm_eps)
            k = rms_norm(k, self.k_norm, cfg.rms_norm_eps)
        q, k = apply_rotary(q, k, *rope)
        attn = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale, *kv_scales)
        h = h + _matmul(attn.reshape(t, self.q_size), self.o_proj)
        x = rms_norm(h, self.post_norm, cfg.rms_norm_eps)
        gate, up = _matmul(x, self.gate_up).chunk(2, dim=-1)
        return h + _matmul(F.silu(gate) * up, self.down)


class LlamaModel:
    def __init__(
        self,
        cfg: ModelConfig,
        weights: dict[str, torch.Tensor],
        dtype: torch.dtype,
        device: torch.device,
        max_position: int,
    ) -> None:
        self.cfg = cfg
        w = {name: t.to(device=device, dtype=dtype) for name, t in weights.items()}
        self.embed = w["model.embed_tokens.weight"]
        self.layers = [DecoderLayer(cfg, w, f"model.layers.{i}") for i in range(cfg.num_layers)]
        self.norm = w["model.norm.weight"]
        self.lm_head = self.embed if cfg.tie_word_embeddings else w["lm_head.weight"]
        self.rope = RotaryEmbedding(
            cfg.head_dim, max_position, cfg.rope_theta, cfg.rope_scaling, device
        )
        self.dtype = dtype
        self.device = device

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states after the final norm, [T, hidden]."""
        h = F.embedding(input_ids, self.embed)
        rope = self.rope.cos_sin(positions)  # once per step, shared by every layer
        for i, layer in enumerate(self.layers):
            k_cache, v_cache = kv_cache.layer(i)
            h = layer(h, rope, k_cache, v_cache, meta, kv_cache.layer_scales(i))
        return rms_norm(h, self.norm, self.cfg.rms_norm_eps)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.lm_head).float()

    def weight_bytes(self) -> int:
        tensors = [self.embed, self.norm, *([] if self.lm_head is self.embed else [self.lm_head])]
        for layer in self.layers:
            tensors += [layer.input_norm, layer.post_norm, layer.qkv, layer.o_proj]
            tensors += [layer.gate_up, layer.down]
            tensors += [t for t in (layer.qkv_bias, layer.q_norm, layer.k_norm) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)
