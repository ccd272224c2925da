"""The contiguous-cache baseline of `kvscope bench --gpu`: the engine's own model and weights, with
attention by torch SDPA over one contiguous K/V tensor per layer (no blocks, no tables).

Everything but attention is the engine's: its forward, decoder layers and weights run unchanged,
while the `paged_attention` the layers call is swapped, for one forward at a time, for
`_contiguous_attention`. The swap is process-wide for that forward: run the baseline in a process
that is not serving requests at the same time (the bench's own).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from kvscope.engine.model import llama
from kvscope.engine.model.llama import LlamaModel

if TYPE_CHECKING:
    from kvscope.engine.llm import LLM

PREFILL_TOKENS_PER_CHUNK = 16384  # bounds prefill activations on smaller GPUs
# What the decoder layers call by name in llama's namespace; swapped by name, since the stand-in
# takes a _Span where the engine's attention takes AttentionMetadata.
_SWAPPED = "paged_attention"


def sdpa_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One query token per sequence, q [B, Hq, D], over contiguous k/v [B, Hkv, L, D].

    The group of query heads sharing a KV head rides in SDPA's query-length axis: exact for a
    single decode token (no causal mask), and it keeps SDPA on its flash path for GQA models."""
    b, hq, d = q.shape
    hkv = k.shape[1]
    out = F.scaled_dot_product_attention(q.view(b, hkv, hq // hkv, d), k, v, scale=scale)
    return out.reshape(b, hq, d)


@dataclass(frozen=True)
class _Span:
    """Where one forward's tokens go: `batch` cache rows (`rows`) x `tokens` positions from
    `start`; it rides through the forward in the place of the paged AttentionMetadata."""

    rows: slice
    batch: int
    tokens: int
    start: int


class _ContiguousCache:
    """Stands in for the engine's KVCache in the forward: each layer's K and V [B, Hkv, L, D]."""

    def __init__(self, model: LlamaModel, batch: int, max_len: int) -> None:
        cfg = model.cfg
        shape = (cfg.num_layers, batch, cfg.num_kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=model.dtype, device=model.device)
        self.v = torch.zeros(shape, dtype=model.dtype, device=model.device)

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[index], self.v[index]

    def layer_scales(self, index: int) -> tuple[None, None]:
        return None, None


def _contiguous_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    span: _Span,
    scale: float,
    k_scale: None = None,
    v_scale: None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """`paged_attention` over a contiguous cache: store this step's K/V at their positions, then
    attend with SDPA. Tokens come row by row ([b0 t0, b0 t1, ..., b1 t0, ...]); -> [T, Hq, D].
    The baseline is for full-attention models (the GPU bench's Llama shapes): a window is refused
    rather than silently ignored."""
    if sliding_window is not None:
        raise ValueError(
            f"the contiguous SDPA baseline has no sliding window (layer window {sliding_window})"
        )
    b, t, start = span.batch, span.tokens, span.start
    hq, hkv, d = q.shape[1], k.shape[1], k.shape[2]
    end = start + t
    k_cache[span.rows, :, start:end] = k.view(b, t, hkv, d).transpose(1, 2)
    v_cache[span.rows, :, start:end] = v.view(b, t, hkv, d).transpose(1, 2)
    keys, values = k_cache[span.rows, :, :end], v_cache[span.rows, :, :end]
    if t == 1:
        # Decode: a KV head's query heads become its queries (plain MHA over Hkv heads), so SDPA
        # reads each K/V once on its fastest path, with no GQA support needed.
        return sdpa_decode(q.view(b, hq, d), keys, values, scale)
    out = F.scaled_dot_product_attention(  # a prompt from position 0 (untimed): heads repeated
        q.view(b, t, hq, d).transpose(1, 2),
        keys.repeat_interleave(hq // hkv, dim=1),
        values.repeat_interleave(hq // hkv, dim=1),
        is_causal=True,
        scale=scale,
    )
    return out.transpose(1, 2).reshape(b * t, hq, d)


@contextmanager
def _attention_swapped() -> Iterator[None]:
    """The decoder layers call `_contiguous_attention` instead of `paged_attention` meanwhile."""
    paged = getattr(llama, _SWAPPED)  # an AttributeError here: the layers no longer call it
    setattr(llama, _SWAPPED, _contiguous_attention)
    try:
        yield
    finally:
        setattr(llama, _SWAPPED, paged)


class ContiguousSdpaDecoder:
    """The engine's model over a contiguous cache of `batch` rows x `max_len` positions."""

    def __init__(self, model: LlamaModel, batch: int, max_len: int) -> None:
        self.model = model
        self.cache = _ContiguousCache(model, batch, max_len)

    def forward(self, ids: torch.Tensor, start: int, rows: slice = slice(None)) -> torch.Tensor:
        """ids [b, T] at positions start..start+T-1 for cache rows `rows`; last-token logits."""
        b, t = ids.shape
        positions = torch.arange(start, start + t, device=ids.device).repeat(b)
        with _attention_swapped():
            span = _Span(rows, b, t, start)
            # Stand-ins for the KVCache and the AttentionMetadata: only the swapped-in attention
            # reads the span, and the layers ask the cache for nothing _ContiguousCache lacks.
            hidden = self.model.forward(ids.reshape(-1), positions, self.cache, span)  # type: ignore[arg-type]
        return self.model.compute_logits(hidden.view(b, t, -1)[:, -1])


class ContiguousSdpaBaseline:
    """An engine's model and weights without its KV pool: drop the LLM once this holds its model,
    and the pool's memory is free before the baseline allocates caches of its own."""

    def __init__(self, llm: LLM) -> None:
        self.model: LlamaModel = llm.engine.model

    def decoder(self, batch: int, max_len: int) -> ContiguousSdpaDecoder:
        return ContiguousSdpaDecoder(self.model, batch, max_len)

    def decode_point(
        self, prompts: list[list[int]], steps: int, warmup_steps: int
    ) -> dict[str, float]:
        """Prefill the prompts untimed, then time `steps` greedy decode steps over the batch."""
        device = self.model.device
        batch, length = len(prompts), len(prompts[0])
        decoder = self.decoder(batch, length + warmup_steps + steps + 1)
        ids = torch.tensor(prompts, device=device)
        rows_per_chunk = max(1, PREFILL_TOKENS_PER_CHUNK // length)
        chunks = []
        for lo in range(0, batch, rows_per_chunk):
            rows = slice(lo, min(batch, lo + rows_per_chunk))
            chunks.append(decoder.forward(ids[rows], 0, rows))
        token = torch.cat(chunks).argmax(-1, keepdim=True)
        pos = length
        for _ in range(warmup_steps):
            token = decoder.forward(token, pos).argmax(-1, keepdim=True)
            pos += 1
        step_s = []
        for _ in range(steps):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            token = decoder.forward(token, pos).argmax(-1, keepdim=True)
            token.tolist()  # the engine hands tokens to the host every step too
            step_s.append(time.perf_counter() - start)
            pos += 1
        median = statistics.median(step_s)
        return {"step_ms": 1e3 * median, "tokens_per_s": batch / median}
