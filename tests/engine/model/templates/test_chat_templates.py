"""Built-in chat templates for instruct files without one, the plain transcript for base models,
and the error for an instruct family without a known turn format."""

from __future__ import annotations

import pytest
from tiny_gemma3 import make_tiny_gemma3, make_tiny_gemma3_gguf, tiny_tokenizer
from tiny_models import make_tiny_model

from kvscope.engine import LLM
from kvscope.engine.model.loader import load_model
from kvscope.engine.model.templates.fallbacks import (
    GEMMA_TEMPLATE,
    MissingChatTemplateError,
    ensure_chat_template,
    missing_template_error,
)


def render(messages, template=GEMMA_TEMPLATE) -> str:
    tok = tiny_tokenizer()
    tok.chat_template = template
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_gemma_turns_and_generation_prompt():
    text = render(
        [
            {"role": "user", "content": "Hi there "},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Bye"},
        ]
    )
    assert text == (
        "<bos><start_of_turn>user\nHi there<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_gemma_folds_the_system_prompt_into_the_first_user_turn():
    text = render([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}])
    assert text == "<bos><start_of_turn>user\nBe terse.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    # Only a system prompt so far (the app's context meter asks this): sent as the user turn.
    alone = render([{"role": "system", "content": "Be terse."}])
    assert alone == "<bos><start_of_turn>user\nBe terse.<end_of_turn>\n<start_of_turn>model\n"


def test_gemma_refuses_roles_out_of_turn():
    with pytest.raises(Exception, match="alternate"):
        render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_ensure_keeps_a_files_own_template():
    tok = tiny_tokenizer()
    tok.chat_template = "{{ 'own' }}"
    assert not ensure_chat_template(tok, "gemma3")
    assert tok.chat_template == "{{ 'own' }}"
    bare = tiny_tokenizer()
    # An instruct model of an ambiguous family: nothing guessed.
    assert not ensure_chat_template(bare, "llama", ["llama-2-7b-chat.Q4_0"])
    assert bare.chat_template is None


def test_gguf_without_template_chats_in_gemma_format(tmp_path):
    path = make_tiny_gemma3_gguf(tmp_path / "gemma-3-270m-it.gguf", seed=1)  # instruct-tuned
    loaded = load_model(path)
    assert loaded.tokenizer.chat_template == GEMMA_TEMPLATE
    end_of_turn = loaded.tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert end_of_turn in loaded.config.eos_token_ids  # the turn end stops generation
    llm = LLM(model=loaded, device="cpu", num_kv_blocks=16)
    prompt = llm.engine.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt.startswith("<bos><start_of_turn>user\nhi<end_of_turn>")
    _, ids = llm.engine.tokenize(prompt)
    assert ids[:2] == [2, 3] and end_of_turn in ids  # bos, <start_of_turn>: special tokens


def test_hf_folder_without_template_gets_gemma_turns(tmp_path):
    loaded = load_model(make_tiny_gemma3(tmp_path / "gemma-3-1b-it", seed=1))
    assert loaded.tokenizer.chat_template == GEMMA_TEMPLATE
    assert 4 in loaded.config.eos_token_ids  # <end_of_turn>


def test_unknown_family_error_names_it(tmp_path):
    error = missing_template_error("llama", "model.gguf")
    assert isinstance(error, MissingChatTemplateError) and isinstance(error, ValueError)
    assert "'llama' family" in str(error) and "model.gguf" in str(error)
    # A Llama folder whose tokenizer has no template: Llama 2, Llama 3 and ChatML fine-tunes all
    # call themselves "llama", so no format is guessed.
    folder = make_tiny_model("llama", tmp_path / "llama-instruct", tokenizer=tiny_tokenizer())
    llm = LLM(model=str(folder), device="cpu", num_kv_blocks=16)
    with pytest.raises(MissingChatTemplateError, match="'llama' family"):
        llm.engine.apply_chat_template([{"role": "user", "content": "hi"}])
    assert llm.generate(["hi"])[0].outputs[0].token_ids  # raw prompts still run
