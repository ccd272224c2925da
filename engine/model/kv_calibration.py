"""fp8 KV scales: one short full-precision forward at engine build, amax per layer and KV head.

float8_e4m3 keeps ~2 significant digits anywhere in [2**-6, 448] x scale, so the scale only has
to keep K and V inside that window: scale = HEADROOM x (largest |K| or |V| seen while the model
reads a short calibration chat) / 448. Per KV head, because heads differ by 10x and more (and RoPE
leaves some K channels far larger than the rest). The headroom covers content larger than the
calibration text; values past it saturate at +-448 x scale instead of overflowing. Scales are
fixed for the engine's lifetime, so cached prefix blocks stay valid.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvscope.engine.kv.kv_cache import KVCache
from kvscope.engine.model.attention import AttentionMetadata
from kvscope.engine.model.llama import LlamaModel

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max
HEADROOM = 4.0
MAX_CALIBRATION_TOKENS = 512

CALIBRATION_CHAT = [
    {"role": "system", "content": "You are a helpful assistant. Answer clearly and concisely."},
    {
        "role": "user",
        "content": "Explain how a hash table works, give a short Python example, and compare "
        "its cost with a sorted list. Also: what is 17 * 23, and who wrote 'Hamlet'?",
    },
    {
        "role": "assistant",
        "content": "A hash table maps keys to slots with a hash function, so lookups take O(1) "
        "time on average; a sorted list needs O(log n) binary search and O(n) inserts.\n\n"
        "```python\nphone = {'alice': '555-0100', 'bob': '555-0199'}\n"
        "phone['carol'] = '555-0123'\nprint(phone.get('bob'))  # 555-0199\n```\n\n"
        "Collisions (two keys, one slot) are resolved by chaining or open addressing; the "
        "table grows when its load factor passes about 0.7. 17 * 23 = 391. 'Hamlet' was "
        "written by William Shakespeare around 1600.",
    },
    {"role": "user", "content": "Thanks! Now summarise that in one sentence, in French."},
]


def calibration_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The calibration chat as the engine would tokenize it (plain text without a template)."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            CALIBRATION_CHAT, tokenize=False, add_generation_prompt=True
        )
    else:
        text = "\n\n".join(m["content"] for m in CALIBRATION_CHAT)
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids[:MAX_CALIBRATION_TOKENS]


@torch.inference_mode()
def calibrate_kv_scales(model: LlamaModel, kv_cache: KVCache, token_ids: list[int]) -> None:
    """Set `kv_cache.scales` ([layer, K/V, kv_head]) from a forward over `token_ids` that stores
    K/V in the model's own dtype (a small scratch pool, freed on return)."""
    if kv_cache.scales is None:
        raise ValueError(f"KV scales apply to an fp8 pool, this one is {kv_cache.dtype}")
    cfg, device = model.cfg, model.device
    token_ids = token_ids[: model.rope.max_position]
    n = len(token_ids)
    if n == 0:
        raise ValueError("calibration needs at least one token")
    bs = kv_cache.block_size
    num_blocks = -(-n // bs)
    scratch = KVCache(
        cfg.num_layers, num_blocks, bs, cfg.num_kv_heads, cfg.head_dim, model.dtype, device
    )
    meta = AttentionMetadata.single_prefill(n, bs, device)
    ids = torch.tensor(token_ids, dtype=torch.int64, device=device)
    model.forward(ids, torch.arange(n, device=device), scratch, meta)
    kv = scratch.data.view(cfg.num_layers, 2, -1, cfg.num_kv_heads, cfg.head_dim)[:, :, :n]
    amax = kv.abs().amax(dim=(2, 4)).float()  # [layer, K/V, kv_head]
    scales = torch.where(amax > 0, amax * HEADROOM / FP8_MAX, torch.ones_like(amax))
    kv_cache.scales.copy_(scales)
