"""Paged vs the naive contiguous allocator on the same pool, and what a KVSnapshot costs
(measured in `engine.bench.snapshot_cost`: it feeds the pool's observers directly).

Both engines get the same number of blocks and the same max_model_len and run the same chat
requests, all submitted at once. The contiguous one reserves max_model_len for every sequence at
admission, so fewer sequences fit and most reserved slots stay empty.
"""

from __future__ import annotations

import time

import numpy as np

from kvscope.engine import LLM, SamplingParams
from kvscope.engine.bench.snapshot_cost import measure_snapshot_cost
from kvscope.engine.model.loader import LoadedModel

CONCURRENCY_TARGET = 2.5  # paged peak concurrent sequences over contiguous
PAGED_SHARE_TARGET = 0.92  # paged useful-slot share at block size 16
CONTIGUOUS_SHARE_BAND = (0.20, 0.40)  # what the PagedAttention paper reports for static schemes


def run_allocator(
    loaded: LoadedModel,
    allocator: str,
    prompts: list[list[int]],
    max_tokens: list[int],
    num_blocks: int,
    max_model_len: int,
) -> dict:
    llm = LLM(
        model=loaded,
        device="cpu",
        dtype="float32",
        num_kv_blocks=num_blocks,
        max_model_len=max_model_len,
        allocator=allocator,
    )
    engine = llm.engine
    for i, (prompt, budget) in enumerate(zip(prompts, max_tokens, strict=True)):
        engine.add_request(f"req-{i}/0", prompt, SamplingParams(max_tokens=budget, temperature=0.0))
    shares, running = [], []
    generated = 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                generated += len(out.outputs[0].token_ids)
        m = llm.kv_snapshot().metrics
        if m.slots_held:
            shares.append(m.useful_slot_share)
        running.append(m.num_running)
    wall = time.perf_counter() - start
    stats = llm.stats()
    return {
        "allocator": allocator,
        "num_blocks": num_blocks,
        "block_size": stats["kv_block_size"],
        "max_model_len": max_model_len,
        "peak_concurrent_sequences": stats["peak_num_running"],
        "mean_concurrent_sequences": float(np.mean(running)),
        # Averaged over the steps: tokens stored / slots held by live sequences.
        "useful_slot_share_mean": float(np.mean(shares)),
        "useful_slot_share_min": float(np.min(shares)),
        "generated_tokens": generated,
        "wall_s": wall,
        "tokens_per_s": generated / wall,
        "num_steps": stats["num_steps"],
        "num_preemptions": stats["num_preemptions"],
    }


def compare_allocators(
    loaded: LoadedModel,
    prompts: list[list[int]],
    max_tokens: list[int],
    num_blocks: int = 512,
    max_model_len: int = 1024,
) -> dict:
    paged = run_allocator(loaded, "paged", prompts, max_tokens, num_blocks, max_model_len)
    naive = run_allocator(loaded, "contiguous", prompts, max_tokens, num_blocks, max_model_len)
    concurrency = paged["peak_concurrent_sequences"] / naive["peak_concurrent_sequences"]
    low, high = CONTIGUOUS_SHARE_BAND
    return {
        "paged": paged,
        "contiguous": naive,
        "concurrency_ratio": concurrency,
        "throughput_ratio": paged["tokens_per_s"] / naive["tokens_per_s"],
        "targets": {
            "concurrency_ratio": {
                "value": concurrency,
                "target": CONCURRENCY_TARGET,
                "met": concurrency >= CONCURRENCY_TARGET,
            },
            "paged_useful_share": {
                "value": paged["useful_slot_share_mean"],
                "target": PAGED_SHARE_TARGET,
                "met": paged["useful_slot_share_mean"] > PAGED_SHARE_TARGET,
            },
            "contiguous_useful_share": {
                "value": naive["useful_slot_share_mean"],
                "band": list(CONTIGUOUS_SHARE_BAND),
                "met": low <= naive["useful_slot_share_mean"] <= high,
            },
        },
        "snapshot_cost": measure_snapshot_cost(),
    }
