"""Gemma 3 (text) through the engine against transformers, from an HF folder and from GGUF.

The tiny models (tests/tiny_gemma3.py) have sliding and full layers, a window shorter than the
prompts, and norms/scales/rope bases that differ per layer kind, so a wrong convention anywhere
moves the logprobs far past 1e-4.
"""

from __future__ import annotations

import pytest
import torch
from tiny_gemma3 import WINDOW, make_tiny_gemma3, make_tiny_gemma3_gguf
from transformers import AutoModelForCausalLM

from kvscope.engine import LLM, SamplingParams
from kvscope.engine.model.loader import load_model
from kvscope.engine.model.model_config import FULL, SLIDING

TOLERANCE = 1e-4
# Three prompts of different lengths, all longer than the window: batched prefill, then
# batched decode over sequences whose windows start in different blocks.
PROMPTS = [list(range(10, 50)), list(range(60, 83)), [7, 9, 200, 31, 5, 17, 88, 120, 3, 64, 8]]


def assert_matches_hf(llm: LLM, hf, max_tokens: int = 6) -> None:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=5, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        completion = out.outputs[0]
        assert len(completion.token_ids) == max_tokens
        with torch.no_grad():
            full = torch.tensor([prompt + completion.token_ids[:-1]])
            ref = hf(full).logits[0].float().log_softmax(-1)[len(prompt) - 1 :]
        for step, top in enumerate(completion.logprobs):
            for token, logprob in top.items():
                assert abs(logprob - ref[step, token].item()) < TOLERANCE, (step, token)
            assert completion.token_ids[step] == int(ref[step].argmax()), step


def engine(model, **knobs) -> LLM:
    return LLM(
        model=str(model), device="cpu", dtype="float32", num_kv_blocks=64, block_size=8, **knobs
    )


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_hf_folder_matches_transformers(tmp_path, softcap):
    folder = make_tiny_gemma3(tmp_path / "gemma", seed=3, final_logit_softcapping=softcap)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert_matches_hf(engine(folder), hf)


def test_hf_folder_config(tmp_path):
    cfg = load_model(make_tiny_gemma3(tmp_path / "gemma", seed=1)).config
    assert cfg.architecture == "gemma3"
    assert cfg.layer_types == (SLIDING,) * 5 + (FULL, SLIDING)
    assert [cfg.layer_window(i) for i in (0, 4, 5, 6)] == [WINDOW, WINDOW, None, WINDOW]
    assert (cfg.rope_theta, cfg.rope_local_theta) == (1_000_000.0, 10_000.0)
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 2.0}  # full layers only
    assert cfg.query_pre_attn_scalar == 24.0
    assert cfg.tie_word_embeddings and cfg.qk_norm


def test_legacy_config_keys(tmp_path):
    """Configs written before transformers 5: rope_theta / rope_local_base_freq / pattern."""
    import json

    folder = make_tiny_gemma3(tmp_path / "gemma", seed=1)
    hf = json.loads((folder / "config.json").read_text())
    for key in ("rope_parameters", "layer_types"):
        hf.pop(key)
    hf |= {"rope_theta": 500_000.0, "rope_local_base_freq": 20_000.0, "sliding_window_pattern": 3}
    (folder / "config.json").write_text(json.dumps(hf))
    cfg = load_model(folder).config
    assert cfg.layer_types == (SLIDING, SLIDING, FULL) * 2 + (SLIDING,)
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.rope_scaling) == (500_000.0, 20_000.0, None)


def test_attention_softcapping_is_refused(tmp_path):
    folder = make_tiny_gemma3(tmp_path / "gemma", seed=1, attn_logit_softcapping=50.0)
    with pytest.raises(ValueError, match="attn_logit_softcapping"):
        load_model(folder)


@pytest.mark.parametrize("quantize_embedding", [False, True], ids=["f32", "q8_0-embedding"])
def test_gguf_matches_transformers(tmp_path, quantize_embedding):
    path = make_tiny_gemma3_gguf(
        tmp_path / "gemma.gguf", seed=4, quantize_embedding=quantize_embedding
    )
    # transformers' GGUF loader leaves query_pre_attn_scalar at its default 256; llama.cpp
    # (and we) scale by head_dim for every size but 27B, so HF is given the same scalar.
    hf = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, dtype=torch.float32, query_pre_attn_scalar=32
    ).eval()
    assert hf.config.layer_types == list(load_model(path).config.layer_types)
    assert_matches_hf(engine(path), hf)


def test_gguf_norms_read_back_in_hf_convention(tmp_path):
    """llama.cpp stores Gemma norms as 1 + w; the source hands out w, as HF names imply."""
    path = make_tiny_gemma3_gguf(tmp_path / "gemma.gguf", seed=4)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32)
    ours = load_model(path).read_all()
    theirs = hf.state_dict()
    for name in ("model.norm.weight", "model.layers.2.post_feedforward_layernorm.weight"):
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=1e-6)
