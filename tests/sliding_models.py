"""Tiny random checkpoints whose layers slide: Mistral (every layer, one window) and Qwen2 with
use_sliding_window (a full layer, then sliding ones: two KV groups), saved as HF folders with a
512-token word-level tokenizer (instant to load; the tests feed token ids)."""

from __future__ import annotations

from pathlib import Path

from tiny_models import random_model, tiny_config

from kvscope.engine.bench.sliding_window import VOCAB, write_wordlevel_tokenizer


def make_sliding_model(
    arch: str, folder: Path, window: int, seed: int = 0, num_layers: int = 2
) -> Path:
    """`arch` "mistral": every layer slides by `window`; "qwen2": layer 0 full, the rest slide
    (HF's max_window_layers rule)."""
    config = tiny_config(arch, VOCAB, bos=0, eos=1)
    config.num_hidden_layers = num_layers
    config.sliding_window = window
    if arch == "qwen2":
        config.use_sliding_window = True
        config.max_window_layers = 1
        config.layer_types = ["full_attention"] + ["sliding_attention"] * (num_layers - 1)
    folder = Path(folder)
    random_model(config, seed).save_pretrained(folder, safe_serialization=True)
    write_wordlevel_tokenizer(folder)
    return folder
