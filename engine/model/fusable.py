"""What the fused CPU decode reads of a model and of its layers, as protocols.

engine.model.llama builds the fused path for itself (`FusedCpuDecode.for_model(self)`), and
engine.model.cpu_decode reads the model's parts back. Naming those parts here, below both,
lets cpu_decode type them without importing llama: LlamaModel and DecoderLayer satisfy these
structurally.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from kvscope.engine.model.linear import Linear, SplitLinear
    from kvscope.engine.model.model_config import ModelConfig
    from kvscope.engine.model.rope import RotaryEmbedding


class FusableLayer(Protocol):
    """A decoder layer's norms, attention shape and projections (engine.model.llama)."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    scale: float
    sliding_window: int | None

    def projections(self) -> list[Linear | SplitLinear]: ...


class FusableModel(Protocol):
    """A Llama-family model's embedding, layers, final norm, rope and head."""

    cfg: ModelConfig
    device: torch.device
    dtype: torch.dtype
    norm: torch.Tensor
    rope: RotaryEmbedding
    lm_head: Linear

    @property
    def layers(self) -> Sequence[FusableLayer]: ...

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor: ...
