"""A Gemma 3 GGUF's tokenizer: converted once, cached, announced while converting."""

from __future__ import annotations

from tiny_gemma3 import make_tiny_gemma3_gguf

from kvscope.engine.model.loader import load_model
from kvscope.engine.model.templates.fallbacks import GEMMA_TEMPLATE
from kvscope.engine.model.tokenizer_cache import cache_key, cache_root

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]


def test_conversion_happens_once_and_is_announced(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSCOPE_DATA_DIR", str(tmp_path / "data"))
    path = make_tiny_gemma3_gguf(tmp_path / "gemma-it.gguf", seed=2)  # instruct: Gemma's turns
    first_lines: list[str] = []
    first = load_model(path, progress=first_lines.append)
    assert any(line.startswith("Converting the tokenizer (262 tokens") for line in first_lines)
    assert (cache_root() / cache_key(path)).is_dir()

    again_lines: list[str] = []
    again = load_model(path, progress=again_lines.append)
    assert not any("Converting" in line for line in again_lines)  # a cache hit: no conversion
    # The cached copy is the same tokenizer, with the built-in template applied on every load.
    assert again.tokenizer.chat_template == first.tokenizer.chat_template == GEMMA_TEMPLATE
    render = dict(tokenize=False, add_generation_prompt=True)
    text = first.tokenizer.apply_chat_template(MESSAGES, **render)
    assert again.tokenizer.apply_chat_template(MESSAGES, **render) == text
    ids = first.tokenizer.encode(text, add_special_tokens=False)
    assert again.tokenizer.encode(text, add_special_tokens=False) == ids
    assert again.config.eos_token_ids == first.config.eos_token_ids == (1, 4)
