"""The Llama-family forward (Llama, Mistral, Qwen2, Qwen3) over a paged KV cache.

Tokens arrive flat ([T]) from many sequences at once; attention reads and writes K/V only through
the block tables in AttentionMetadata. q/k/v and gate/up projections are fused into one matmul
each where their formats agree (`engine.model.linear`), dense or quantized.

The model is built one layer at a time from a `WeightSource`: each tensor is read, converted
into its runtime form on the target device, and the read copy dropped before the next, so the
build never holds more than the finished layers plus one layer in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Literal, overload

import torch
import torch.nn.functional as F

from kvscope.engine.kv.kv_cache import KVCache
from kvscope.engine.model.attention import AttentionMetadata, paged_attention
from kvscope.engine.model.cpu_decode import FusedCpuDecode
from kvscope.engine.model.linear import Embedding, Linear, SplitLinear, fused, place
from kvscope.engine.model.model_config import ModelConfig
from kvscope.engine.model.rope import RotaryEmbedding, apply_rotary
from kvscope.engine.model.weight_source import Weight, WeightSource


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)  # fused; bit-identical to the below here
    # float32 statistics, cast back before the weight: the exact order HF's LlamaRMSNorm uses.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def layer_index(prefix: str) -> int:
    """The layer number in a tensor prefix such as "model.layers.7"."""
    return int(prefix.rsplit(".", 1)[-1])


class DecoderLayer:
    def __init__(self, cfg: ModelConfig, read: _Reader, prefix: str) -> None:
        """`read(name, kind)` returns one tensor: kind "linear" placed for matmuls (or raw when
        fused), "vector" for norms and biases."""
        self.cfg = cfg
        attn = f"{prefix}.self_attn"
        self.input_norm = read(f"{prefix}.input_layernorm.weight", "vector")
        self.post_norm = read(f"{prefix}.post_attention_layernorm.weight", "vector")
        qkv_bias = (
            [read(f"{attn}.{p}_proj.bias", "raw-vector") for p in "qkv"]
            if cfg.attention_bias
            else None
        )
        self.qkv = read.fused([f"{attn}.{p}_proj.weight" for p in "qkv"], qkv_bias)
        self.o_proj = read(f"{attn}.o_proj.weight", "linear")
        self.q_norm = read(f"{attn}.q_norm.weight", "vector") if cfg.qk_norm else None
        self.k_norm = read(f"{attn}.k_norm.weight", "vector") if cfg.qk_norm else None
        self.gate_up = read.fused([f"{prefix}.mlp.{p}_proj.weight" for p in ("gate", "up")])
        self.down = read(f"{prefix}.mlp.down_proj.weight", "linear")
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.sliding_window = cfg.layer_window(layer_index(prefix))

    def projections(self) -> list[Linear | SplitLinear]:
        return [self.qkv, self.o_proj, self.gate_up, self.down]

    def vectors(self) -> list[torch.Tensor]:
        """The layer's norm weights (what weight_bytes counts besides the projections)."""
        norms = (self.input_norm, self.post_norm, self.q_norm, self.k_norm)
        return [t for t in norms if t is not None]

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The family's RMSNorm (Gemma's differs: engine/model/gemma3.py)."""
        return rms_norm(x, weight, self.cfg.rms_norm_eps)

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
        h = h + self.o_proj(self.attend(x, rope, k_cache, v_cache, meta, kv_scales))
        x = self.norm(h, self.post_norm)
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)

    def attend(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        kv_scales: tuple[torch.Tensor | None, torch.Tensor | None],
    ) -> torch.Tensor:
        """Normed input -> attention output before o_proj, [T, Hq * D] (shared with Gemma)."""
        cfg = self.cfg
        t = x.shape[0]
        qkv = self.qkv(x)
        q, k, v = torch.split(qkv, [self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, cfg.num_heads, cfg.head_dim)
        k = k.view(t, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(t, cfg.num_kv_heads, cfg.head_dim)
        if self.q_norm is not None and self.k_norm is not None:  # both or neither (qk_norm)
            q = self.norm(q, self.q_norm)
            k = self.norm(k, self.k_norm)
        q, k = apply_rotary(q, k, *rope)
        attn = paged_attention(
            q,
            k,
            v,
            k_cache,
            v_cache,
            meta,
            self.scale,
            *kv_scales,
            sliding_window=self.sliding_window,
        )
        return attn.reshape(t, self.q_size)


class _Reader:
    """Reads tensors from a source in their runtime form on the model's device and dtype.

    Matrices are read one ahead on a helper thread: reading and decoding the next tensor (numpy,
    which releases the GIL) overlaps with laying out the current one, and at most one extra
    tensor is in flight, so the build's peak grows by one tensor at most."""

    def __init__(
        self,
        source: WeightSource,
        quantization: str,
        dtype: torch.dtype,
        device: torch.device,
        order: list[str],
    ) -> None:
        self.source, self.quantization = source, quantization
        self.dtype, self.device = dtype, device
        self.order = order
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-read")
        self.pending: dict[str, Future[Weight]] = {}

    def _read(self, name: str) -> Weight:
        return self.source.read(name, self.quantization, self.dtype)

    def raw(self, name: str) -> Weight:
        future = self.pending.pop(name, None)
        at = self.order.index(name) if name in self.order else -1
        if at >= 0 and at + 1 < len(self.order) and self.order[at + 1] not in self.pending:
            nxt = self.order[at + 1]
            self.pending[nxt] = self.pool.submit(self._read, nxt)
        return future.result() if future is not None else self._read(name)

    def close(self) -> None:
        for future in self.pending.values():
            future.cancel()
        self.pending.clear()
        self.pool.shutdown(wait=True)

    @overload
    def __call__(self, name: str, kind: Literal["linear"]) -> Linear: ...

    @overload
    def __call__(self, name: str, kind: Literal["vector", "raw-vector"]) -> torch.Tensor: ...

    def __call__(self, name: str, kind: str) -> Linear | torch.Tensor:
        if kind == "linear":
            return place(self.raw(name), self.device, self.dtype)
        w = self.source.read(name, "none", self.dtype)  # norms and biases stay dense
        assert isinstance(w, torch.Tensor)  # quantization "none" reads every tensor dense
        return w if kind == "raw-vector" else w.to(self.device)

    def fused(
        self, names: list[str], biases: list[torch.Tensor] | None = None
    ) -> Linear | SplitLinear:
        return fused([self.raw(n) for n in names], self.device, self.dtype, biases)


def _matrix_order(cfg: ModelConfig) -> list[str]:
    """The matrices in the order the build asks for them (what the reader prefetches)."""
    order = ["model.embed_tokens.weight"]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}"
        order += [f"{p}.self_attn.{x}_proj.weight" for x in ("q", "k", "v", "o")]
        order += [f"{p}.mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
    if not cfg.tie_word_embeddings:
        order.append("lm_head.weight")
    return order


class LlamaModel:
    # Subclasses for other families (engine/model/gemma3.py) swap the layer and override the
    # hooks below (embed_tokens, step_rotary, final_norm); the layer loop stays this one.
    layer_class = DecoderLayer

    def __init__(
        self,
        cfg: ModelConfig,
        weights: WeightSource,
        dtype: torch.dtype,
        device: torch.device,
        max_position: int,
        quantization: str = "auto",
    ) -> None:
        self.cfg = cfg
        read = _Reader(weights, quantization, dtype, device, _matrix_order(cfg))
        try:
            self.embed = Embedding(read.raw("model.embed_tokens.weight"), device, dtype)
            self.layers = [
                self.layer_class(cfg, read, f"model.layers.{i}") for i in range(cfg.num_layers)
            ]
            self.norm = read("model.norm.weight", "vector")
            if cfg.tie_word_embeddings:
                self.lm_head = self.embed.as_head(device, dtype)
            else:
                self.lm_head = read("lm_head.weight", "linear")
        finally:
            read.close()
        self.rope = RotaryEmbedding(
            cfg.head_dim, max_position, cfg.rope_theta, cfg.rope_scaling, device
        )
        self.dtype = dtype
        self.device = device
        # Decode-only steps on a CPU with numba's quantized weights (engine/model/cpu_decode.py);
        # None keeps every step on the torch forward below (subclasses have their own layers).
        self.fused_decode = FusedCpuDecode.for_model(self) if type(self) is LlamaModel else None

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata | Sequence[AttentionMetadata],
    ) -> torch.Tensor:
        """Hidden states after the final norm, [T, hidden] (in the model's dtype; float32 from
        the fused CPU decode, whose quantized head takes them as they are).

        `meta`: one AttentionMetadata for every layer, or one per KV group of the cache's
        layout (each group has its own block tables and slots); layer i uses its group's."""
        # A list/tuple is per group; anything else serves every layer (AttentionMetadata, or the
        # contiguous baseline's span in engine/bench/contiguous_sdpa.py).
        metas = tuple(meta) if isinstance(meta, (list, tuple)) else (meta,)
        fused = self.fused_decode
        if fused is not None and fused.accepts(input_ids.shape[0], metas, kv_cache):
            return fused(input_ids, positions, kv_cache, metas)
        h = self.embed_tokens(input_ids)
        ropes = self.step_rotary(positions)  # once per step, one (cos, sin) per layer
        for i, layer in enumerate(self.layers):
            k_cache, v_cache = kv_cache.layer(i)
            layer_meta = metas[kv_cache.group_of(i)] if len(metas) > 1 else metas[0]
            h = layer(h, ropes[i], k_cache, v_cache, layer_meta, kv_cache.layer_scales(i))
        return self.final_norm(h)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed(input_ids)

    def step_rotary(self, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """cos/sin for this step's positions, per layer; every Llama layer shares one table."""
        return [self.rope.cos_sin(positions)] * len(self.layers)

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return rms_norm(h, self.norm, self.cfg.rms_norm_eps)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def weight_bytes(self) -> int:
        """Bytes the weights take in their runtime form (a head shared with the embedding
        counts once; a CPU int4 copy of a tied table counts twice, as it is twice in memory)."""
        total = self.embed.nbytes + self.norm.numel() * self.norm.element_size()
        head = self.lm_head
        if head.weight is not self.embed.weight:
            total += head.nbytes
        for layer in self.layers:
            total += sum(p.nbytes for p in layer.projections())
            total += sum(t.numel() * t.element_size() for t in layer.vectors())
        return total

    def weight_format(self) -> dict[str, str]:
        """What the matmul weights are ("Q4_K+Q6_K", "int8", "bfloat16") and how they run."""
        linears = [self.lm_head, *(p for layer in self.layers for p in layer.projections())]
        kinds = dict.fromkeys(k for lin in linears for k in lin.kind.split("+"))
        layouts = dict.fromkeys(lay for lin in linears for lay in lin.layout.split("+"))
        return {"format": "+".join(sorted(kinds)), "layout": "+".join(layouts)}
