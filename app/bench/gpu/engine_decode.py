"""The engine half of `kvscope bench --gpu`: decode tokens/s of the engine on the bundled model.

Contenders over batch x context: the engine with a 16-bit KV cache, with fp8 KV where the GPU
has it, and the engine's own model with one contiguous cache per layer and SDPA attention
(`engine.bench.contiguous_sdpa`), on the same weights. Engine steps are wall clock between
device synchronizations: a step's host-side scheduling is part of what the engine costs.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from kvscope.app.bench.gpu.device import has_fp8, release, synchronize
from kvscope.engine import LLM, SamplingParams
from kvscope.engine.bench.contiguous_sdpa import ContiguousSdpaBaseline
from kvscope.engine.model.loader import LoadedModel

if TYPE_CHECKING:
    from kvscope.app.bench.gpu.settings import GpuBenchSettings


def random_prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """Distinct random prompts: shared ones would share blocks (and L2) and flatter decode."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab, (batch, length), generator=g).tolist()


def engine_decode_point(llm: LLM, prompts: list[list[int]], steps: int, warmup_steps: int) -> dict:
    """Prefill every prompt untimed, then time `steps` decode steps over the whole batch."""
    engine = llm.engine
    device = llm.config.torch_device
    params = SamplingParams(max_tokens=warmup_steps + steps + 2, temperature=0.0, ignore_eos=True)
    ids = [f"gpu-bench-{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts, strict=True):
        engine.add_request(rid, prompt, params)
    try:
        started: set[str] = set()
        while len(started) < len(ids):  # chunked prefill; decodes of early finishers run along
            started.update(o.request_id for o in engine.step() if o.outputs[0].token_ids)
        for _ in range(warmup_steps):
            engine.step()
        step_s = []
        for _ in range(steps):
            synchronize(device)
            start = time.perf_counter()
            engine.step()
            synchronize(device)
            step_s.append(time.perf_counter() - start)
    finally:
        for rid in ids:
            engine.abort_request(rid)
    median = statistics.median(step_s)
    return {"step_ms": 1e3 * median, "tokens_per_s": len(prompts) / median}


def engine_grid(settings: GpuBenchSettings, loaded: LoadedModel, device: torch.device) -> dict:
    """Decode tokens/s per (batch, context) for each contender; contexts past the model's window
    are cut to fit (the point records the prompt length used)."""
    mc = loaded.config
    room = settings.warmup_steps + settings.decode_steps + 2
    max_len = mc.max_position_embeddings
    lengths = sorted({min(c, max_len - room) for c in settings.engine_contexts})
    batches = settings.engine_batches
    bs = settings.block_size
    blocks = max(batches) * math.ceil((max(lengths) + room) / bs) + max(batches)
    kv_dtypes = ["auto"] + (["fp8"] if has_fp8(device) else [])
    rows: dict[str, list[dict]] = {}
    for kv in kv_dtypes:
        llm = LLM(
            model=loaded,
            device=str(device),
            kv_cache_dtype=kv,
            block_size=bs,
            num_kv_blocks=blocks,
            max_num_seqs=max(batches),
            enable_prefix_caching=False,
        )
        name = f"engine_kv_{kv if kv == 'fp8' else 'model_dtype'}"

        def engine_point(prompts: list[list[int]], llm: LLM = llm) -> dict:
            return engine_decode_point(llm, prompts, settings.decode_steps, settings.warmup_steps)

        rows[name] = _grid(engine_point, batches, lengths, mc.vocab_size)
        baseline = ContiguousSdpaBaseline(llm)  # the same weights serve the baseline below
        del llm, engine_point
        release(device)  # the pool goes before the next contender allocates its own

    def sdpa_point(prompts: list[list[int]]) -> dict:
        return baseline.decode_point(prompts, settings.decode_steps, settings.warmup_steps)

    rows["sdpa_contiguous"] = _grid(sdpa_point, batches, lengths, mc.vocab_size)
    return rows


def _grid(
    run: Callable[[list[list[int]]], dict], batches: tuple[int, ...], lengths: list[int], vocab: int
) -> list[dict]:
    points = []
    for batch in batches:
        for length in lengths:
            point: dict[str, object] = {"batch": batch, "prompt_tokens": length}
            try:
                point |= run(random_prompts(batch, length, vocab, seed=batch * 7919 + length))
            except torch.cuda.OutOfMemoryError as e:
                point["error"] = f"out of memory: {e}".splitlines()[0]
                release(torch.device("cuda"))
            points.append(point)
    return points
