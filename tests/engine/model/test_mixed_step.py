"""A step with a prompt chunk beside decodes (engine/model_runner.py -> LlamaModel.forward): one
batched matmul per projection per layer over all its rows, and each row's result what the same
token computes in a step of its own kind (the chunk alone, the decodes alone)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_quant_gguf

from kvscope.engine import LLM
from kvscope.engine.kv.kv_cache import KVCache
from kvscope.engine.model.attention import AttentionMetadata
from kvscope.engine.quant import cpu_layout
from kvscope.kernels import cpu_gemv

pytestmark = pytest.mark.skipif(not cpu_gemv.installed(), reason="numba is not installed")

BLOCK = 16
CONTEXTS = (5, 20)  # decoding sequences' tokens in the pool
CHUNK = 37  # the prompt chunk's tokens
TABLES = ([3], [7, 1], [9, 4, 11])  # two decodes, then the prompt


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = make_quant_gguf(tmp_path_factory.mktemp("mixed") / "m.gguf", "Q4_0", 5)
    m = LLM(model=path, device="cpu", dtype="bfloat16", num_kv_blocks=32).engine.model
    m.fused_decode = None  # decode-only steps on the torch forward too: rows comparable bitwise
    return m


def _pool(model) -> KVCache:
    cfg = model.cfg
    return KVCache(
        cfg.num_layers, 16, BLOCK, cfg.num_kv_heads, cfg.head_dim, model.dtype, model.device
    )


def _slots(table: list[int], start: int, stop: int) -> list[int]:
    return [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(start, stop)]


def _meta(decodes: list[int], chunk: bool) -> AttentionMetadata:
    """Decodes of the sequences `decodes` (indices into CONTEXTS) then, if `chunk`, the prompt."""
    i32 = torch.int32
    slots = [s for d in decodes for s in _slots(TABLES[d], CONTEXTS[d], CONTEXTS[d] + 1)]
    if chunk:
        slots += _slots(TABLES[2], 0, CHUNK)
    width = 3
    pad = [list(TABLES[d]) + [0] * (width - len(TABLES[d])) for d in decodes]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        num_decode_tokens=len(decodes),
        decode_block_tables=torch.tensor(pad, dtype=i32) if decodes else None,
        decode_seq_lens=torch.tensor([CONTEXTS[d] + 1 for d in decodes], dtype=i32)
        if decodes
        else None,
        prefill_block_tables=torch.tensor([TABLES[2]], dtype=i32) if chunk else None,
        prefill_query_start_loc=torch.tensor([0, CHUNK], dtype=i32) if chunk else None,
        prefill_seq_lens=torch.tensor([CHUNK], dtype=i32) if chunk else None,
    )


def _filled_pool(model) -> KVCache:
    """The decoding sequences' contexts prefilled into a fresh pool."""
    pool = _pool(model)
    for d, n in enumerate(CONTEXTS):
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(_slots(TABLES[d], 0, n)),
            num_decode_tokens=0,
            decode_block_tables=None,
            decode_seq_lens=None,
            prefill_block_tables=torch.tensor([TABLES[d]], dtype=torch.int32),
            prefill_query_start_loc=torch.tensor([0, n], dtype=torch.int32),
            prefill_seq_lens=torch.tensor([n], dtype=torch.int32),
        )
        ids = torch.arange(10, 10 + n) % model.cfg.vocab_size
        model.forward(ids, torch.arange(n), pool, meta)
    return pool


def test_a_mixed_step_is_one_matmul_per_projection_and_rows_match_separate_steps(
    model, monkeypatch
):
    decode_ids = torch.tensor([40, 41])
    prompt_ids = torch.arange(50, 50 + CHUNK) % model.cfg.vocab_size
    decode_pos = torch.tensor(CONTEXTS)
    prompt_pos = torch.arange(CHUNK)

    pool = _filled_pool(model)
    alone_decodes = model.forward(decode_ids, decode_pos, pool, _meta([0, 1], chunk=False))
    alone_chunk = model.forward(prompt_ids, prompt_pos, pool, _meta([], chunk=True))

    calls: list[int] = []
    matmul = cpu_layout.gemv_matmul
    monkeypatch.setattr(
        cpu_layout, "gemv_matmul", lambda w, x: calls.append(x.shape[0]) or matmul(w, x)
    )
    pool = _filled_pool(model)
    calls.clear()
    mixed = model.forward(
        torch.cat([decode_ids, prompt_ids]),
        torch.cat([decode_pos, prompt_pos]),
        pool,
        _meta([0, 1], chunk=True),
    )
    # qkv, o, gate_up and down once a layer, each over every row of the step.
    assert calls == [2 + CHUNK] * (4 * model.cfg.num_layers)
    assert torch.equal(mixed[:2], alone_decodes)
    assert torch.equal(mixed[2:], alone_chunk)
