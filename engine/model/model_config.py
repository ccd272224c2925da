"""The architecture facts the forward pass and the KV planner need, whatever file they came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["FULL", "LAYER_TYPES", "ModelConfig", "SLIDING"]

FULL = "full_attention"
SLIDING = "sliding_attention"
LAYER_TYPES = (FULL, SLIDING)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # "llama" | "mistral" | "qwen2" | "qwen3" | "gemma3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    # HF-style rope_scaling dict ({"rope_type": "llama3", "factor": ...}) or None.
    rope_scaling: dict[str, Any] | None = None
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before RoPE
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    name: str = ""  # a human label: file or folder name
    # Sliding-window attention: a sliding layer's query at position p attends to keys j with
    # p - sliding_window < j <= p (the window counts the token itself).
    sliding_window: int | None = None
    # Per layer "full_attention" | "sliding_attention" (HF's names). () = every layer full,
    # unless sliding_window is set, then every layer slides (Mistral).
    layer_types: tuple[str, ...] = field(default_factory=tuple)
    # Gemma 3 only (engine/model/gemma3.py); the defaults are what every other family does.
    hidden_activation: str = "silu"  # "gelu_pytorch_tanh" for Gemma
    query_pre_attn_scalar: float | None = None  # attention scale is this ** -0.5 (None: head_dim)
    rope_local_theta: float | None = None  # rope base of sliding layers (None: rope_theta)
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)

    def __post_init__(self) -> None:
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None, got {self.sliding_window}")
        if self.layer_types:
            if len(self.layer_types) != self.num_layers:
                raise ValueError(
                    f"layer_types has {len(self.layer_types)} entries, the model has "
                    f"{self.num_layers} layers"
                )
            unknown = set(self.layer_types) - set(LAYER_TYPES)
            if unknown:
                raise ValueError(f"unknown layer types {sorted(unknown)}; known: {LAYER_TYPES}")
            if SLIDING in self.layer_types and self.sliding_window is None:
                raise ValueError("layer_types has sliding layers but sliding_window is None")

    def layer_window(self, layer: int) -> int | None:
        """The window of layer `layer` in tokens, or None for full attention."""
        if self.sliding_window is None:
            return None
        if not self.layer_types:
            return self.sliding_window
        return self.sliding_window if self.layer_types[layer] == SLIDING else None

    def layer_windows(self) -> tuple[int | None, ...]:
        return tuple(self.layer_window(i) for i in range(self.num_layers))

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes
