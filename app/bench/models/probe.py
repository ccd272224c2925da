"""One model load + decode in a fresh process, for `kvscope bench --models`.

Run as `python -m kvscope.app.bench.models.probe MODEL QUANTIZATION KV_BYTES`; prints one JSON line.
A process of its own so that its peak RSS (getrusage) is this load's peak and nothing else's.
"""

from __future__ import annotations

import json
import resource
import sys
import time

PROMPT_TOKENS = 32
DECODE_TOKENS = {1: 16, 16: 8}  # batch -> tokens generated per sequence


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def main(argv: list[str]) -> int:
    model, quantization, kv_bytes = argv[0], argv[1], int(argv[2])
    import torch

    from kvscope.engine import LLM, SamplingParams

    rss_before = rss_bytes()
    start = time.perf_counter()
    llm = LLM(model=model, device="cpu", quantization=quantization, kv_cache_memory=kv_bytes)
    load_s = time.perf_counter() - start
    rss_loaded = rss_bytes()
    stats = llm.stats()
    decode = {}
    vocab = llm.engine.model_config.vocab_size
    gen = torch.Generator().manual_seed(0)
    engine = llm.engine
    for batch, tokens in DECODE_TOKENS.items():
        # A short untimed run first: the CPU kernels pick and prepare their code paths per shape
        # on first use (measured: the first steps of a 1.1B model ran at a quarter speed).
        for timed in (False, True):
            prompts = [
                torch.randint(3, vocab, (PROMPT_TOKENS,), generator=gen).tolist()
                for _ in range(batch)
            ]
            params = SamplingParams(
                temperature=0, max_tokens=tokens if timed else 3, ignore_eos=True
            )
            for i, p in enumerate(prompts):
                engine.add_request(f"b{batch}-{timed}-{i}", p, params)
            # Prefill first (not timed; a request's first token comes at its prefill's end),
            # then time the decode steps alone.
            prefilled: set[str] = set()
            while len(prefilled) < batch:
                prefilled.update(o.request_id for o in engine.step() if o.outputs[0].token_ids)
            steps, t0 = 0, time.perf_counter()
            while engine.has_unfinished_requests():
                engine.step()
                steps += 1
            elapsed = time.perf_counter() - t0
        decode[str(batch)] = {
            "tokens_per_s": batch * steps / elapsed if elapsed > 0 else None,
            "steps": steps,
        }
    print(
        json.dumps(
            {
                "load_s": load_s,
                "rss_before_load": rss_before,
                "rss_after_load": rss_loaded,
                "peak_rss": peak_rss_bytes(),
                "weight_bytes": stats["weight_bytes"],
                "weight_format": stats["weight_format"],
                "weight_layout": stats["weight_layout"],
                "dtype": stats["dtype"],
                "kv_cache_bytes": stats["kv_cache_bytes"],
                "decode": decode,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
