"""KV blocks held versus tokens for one long generation, sliding windows honoured and ignored.

Tiny random checkpoints built here (no download): a Mistral whose every layer slides by a small
window, and, where the engine loads Gemma 3, a Gemma 3 with its 5 sliding : 1 full layer pattern.
Each generates `num_tokens` greedy tokens at batch 1 on the CPU, once with the paged allocator's
window release on (sliding groups give blocks back: `engine.kv.layout`) and once with it off (one
group, every block kept; the kernels still mask at each layer's window, so the tokens agree).
After every step the pool's blocks held, per KV group, and their bytes are recorded.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kvscope.engine.config import EngineConfig
from kvscope.engine.kv.snapshot import BlockState
from kvscope.engine.llm_engine import LLMEngine
from kvscope.engine.model.loader import load_model
from kvscope.engine.sampling_params import SamplingParams
from kvscope.engine.sizing.kv_pool import bytes_per_block, kv_layout

if TYPE_CHECKING:
    from transformers import PreTrainedModel

VOCAB = 512


def write_wordlevel_tokenizer(folder: Path) -> None:
    """A word-level tokenizer of VOCAB tokens "t0".."t511": the loader wants one; the bench
    feeds token ids."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = Whitespace()
    # transformers declares this constructor as (*args, **kwargs), unannotated
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, unk_token="t0", eos_token="t1"
    )
    fast.save_pretrained(folder)


def _save(model: PreTrainedModel, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    write_wordlevel_tokenizer(folder)
    return folder


def tiny_mistral(folder: Path, window: int, context: int, seed: int = 0) -> Path:
    import transformers

    config = transformers.MistralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        sliding_window=window,
        eos_token_id=1,
        bos_token_id=0,
    )
    torch.manual_seed(seed)
    # train(False) is eval(), which transformers leaves unannotated
    return _save(transformers.MistralForCausalLM(config).train(False), folder)


def tiny_gemma3(folder: Path, window: int, context: int, seed: int = 0) -> Path:
    """6 layers, 5 sliding then 1 full (Gemma 3's pattern): two KV groups of equal size would
    need 5 : 1, so the layout makes groups of 1 layer (five sliding groups, one full)."""
    import transformers

    config = transformers.Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=context,
        sliding_window=window,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        eos_token_id=1,
        bos_token_id=0,
        pad_token_id=2,
    )
    torch.manual_seed(seed)
    return _save(transformers.Gemma3ForCausalLM(config).train(False), folder)


def held_curve(
    folder: Path, release: bool, num_tokens: int, prompt_len: int, block_size: int
) -> dict[str, Any]:
    """One greedy generation of num_tokens after a prompt_len prompt; per step the tokens in the
    sequence and the blocks (and bytes) the pool holds, in total and per KV group."""
    context = prompt_len + num_tokens
    config = EngineConfig(
        model=str(folder),
        device="cpu",
        dtype="float32",
        block_size=block_size,
        max_model_len=context,
        enable_prefix_caching=False,
        release_window_blocks=release,
    )
    loaded = load_model(folder)
    # Room for the whole context in every group: the run with windows ignored needs it all.
    groups = kv_layout(config, loaded.config).num_groups
    config = replace(config, num_kv_blocks=groups * (-(-context // block_size) + 2))
    engine = LLMEngine(config, loaded)
    per_block = bytes_per_block(engine.config, engine.model_config)
    prompt = [3 + (i * 7) % (VOCAB - 3) for i in range(prompt_len)]
    params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    engine.add_request("long", prompt, params)
    tokens, held, by_group = [], [], []
    start = time.perf_counter()
    output_ids: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                output_ids = list(out.outputs[0].token_ids)
        snap = engine.kv_snapshot()
        running = [s for s in snap.sequences if s.status == "running"]
        if not running:
            continue
        tokens.append(running[0].num_computed_tokens)
        held.append(int((snap.state == BlockState.USED).sum()))
        by_group.append(list(snap.metrics.group_blocks_used))
    seconds = time.perf_counter() - start
    engine.allocator.check_invariants()
    return {
        "model": engine.model_config.architecture,
        "windows_honoured": release,
        "group_windows": list(engine.kv_layout.windows),
        "group_size": engine.kv_layout.group_size,
        "block_size": block_size,
        "bytes_per_block": per_block,
        "num_blocks": engine.allocator.num_blocks,
        "tokens": tokens,
        "blocks_held": held,
        "blocks_held_by_group": by_group,
        "peak_blocks": max(held),
        "peak_bytes": max(held) * per_block,
        "final_blocks": held[-1],
        "blocks_released": engine.kv_snapshot().metrics.blocks_released,
        "generated": len(output_ids),
        "output_ids": output_ids,
        "seconds": round(seconds, 2),
    }


def run_sliding_bench(
    out: Path,
    workdir: Path,
    num_tokens: int = 4000,
    window: int = 32,
    block_size: int = 8,
    prompt_len: int = 16,
    models: tuple[str, ...] = ("mistral", "gemma3"),
) -> dict[str, Any]:
    """Both models, both modes; writes bench_sliding.json (no plot: the app draws it)."""
    out.mkdir(parents=True, exist_ok=True)
    context = prompt_len + num_tokens
    builders = {"mistral": tiny_mistral, "gemma3": tiny_gemma3}
    runs, skipped = [], {}
    for name in models:
        try:
            folder = builders[name](workdir / f"tiny-{name}-w{window}", window, context)
            pair = [
                held_curve(folder, r, num_tokens, prompt_len, block_size) for r in (True, False)
            ]
        except Exception as e:  # a model this engine cannot load yet is reported, not fatal
            skipped[name] = f"{type(e).__name__}: {e}"
            continue
        honoured, ignored = pair
        # The window is honoured by the kernels either way: the same greedy tokens.
        honoured["same_tokens_as_ignored"] = honoured["output_ids"] == ignored["output_ids"]
        runs += pair
    for run in runs:
        run.pop("output_ids")
    report = {
        "num_tokens": num_tokens,
        "prompt_len": prompt_len,
        "window": window,
        "block_size": block_size,
        "runs": runs,
        "skipped": skipped,
    }
    (out / "bench_sliding.json").write_text(json.dumps(report, indent=1))
    return report
