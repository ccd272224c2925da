"""Tokenizers compared on what they do: shared by the tokenizer cache's tests and the shipped
tokenizer's."""

from __future__ import annotations

TEXTS = [
    "Hello world",
    "  leading spaces,\ttabs\n\nand newlines ",
    "emoji 🤖🎉 and a family 👩‍👩‍👧",
    "中文测试，日本語のテキスト、한국어",
    "Ünïcödé àçcénts ß 3.14159 1234567",
    "<|im_start|>user\nraw special tokens<|im_end|> <|endoftext|>",
    "",
]


MESSAGES = [
    {"role": "system", "content": "You are 🤖"},
    {"role": "user", "content": "Translate 你好, please"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Thanks"},
]


def assert_same_tokenizer(a, b):
    chat = [a.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)]
    assert chat == [b.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)]
    for text in TEXTS + chat:
        ids = a(text).input_ids
        assert ids == b(text).input_ids, text
        assert a.decode(ids) == b.decode(ids) == text
        assert a.decode(ids, skip_special_tokens=True) == b.decode(ids, skip_special_tokens=True)
    for name in ("chat_template", "bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        assert getattr(a, name) == getattr(b, name), name
    assert a.all_special_tokens == b.all_special_tokens
    assert a.added_tokens_decoder == b.added_tokens_decoder
    assert a.get_vocab() == b.get_vocab()
