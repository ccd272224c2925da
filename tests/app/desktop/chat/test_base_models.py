"""A model without a chat template that looks like a base model is chatted with as one (issue 29,
item 5): a plain transcript, a notice in the chat, replies that stop at the next "User:" line.

Filed: a Gemma 3 270M base GGUF got Gemma's instruct turns silently and looped to max_tokens.
"""

from __future__ import annotations

import pytest
from named_ggufs import make_named_gguf
from tiny_gemma3 import make_tiny_gemma3_gguf, tiny_tokenizer

from kvscope.app.core.engine_messages import EngineInfo
from kvscope.app.core.settings import EngineSettings
from kvscope.app.desktop.chat.completion_style import BASE_MODEL_NOTICE, completion_params
from kvscope.engine import LLM, SamplingParams
from kvscope.engine.model.loader import load_model
from kvscope.engine.model.templates.fallbacks import (
    CHATML_TEMPLATE,
    COMPLETION_TEMPLATE,
    GEMMA_TEMPLATE,
    ensure_chat_template,
    looks_like_base_model,
)

TIMEOUT_MS = 120_000
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "bye"},
]


@pytest.mark.parametrize(
    ("arch", "names", "base"),
    [
        ("gemma3", ["gemma-3-270m.Q4_K_M", "Gemma 3 270m"], True),
        ("gemma3", ["gemma-3-270m-it-Q4_K_M"], False),
        ("gemma3", ["model", "Gemma 3 270m", "it"], False),  # general.finetune "it"
        ("gemma3", ["gemma-3-1b-pt"], True),
        ("llama", ["TinyLlama-1.1B-Chat-v1.0.Q4_K_M"], False),
        ("llama", ["Llama-3.2-1B-Instruct-Q4_K_M"], False),
        ("llama", ["Meta-Llama-3-8B.Q4_0"], True),
        ("qwen2", ["qwen2-0_5b-instruct-q4_0"], False),
        ("qwen2", ["Qwen2-0.5B.Q4_K_M"], True),
        ("qwen3", ["Qwen3-0.6B-Q8_0"], False),  # Qwen3's unmarked releases are post-trained
        ("qwen3", ["Qwen3-0.6B-Base.Q8_0"], True),
        ("mistral", ["Mistral-7B-Instruct-v0.3"], False),
        ("llama", ["smollm2-135m-itch"], True),  # words, not substrings: "itch" is not "it"
    ],
)
def test_base_models_are_told_apart_by_their_names(arch, names, base):
    assert looks_like_base_model(arch, names) is base


def test_a_base_model_gets_the_transcript_and_an_instruct_one_its_family_turns():
    base, instruct = tiny_tokenizer(), tiny_tokenizer()
    assert ensure_chat_template(base, "gemma3", ["gemma-3-270m", "Gemma 3 270m"])
    assert base.chat_template == COMPLETION_TEMPLATE
    assert ensure_chat_template(instruct, "qwen3", ["Qwen3-0.6B"])
    assert instruct.chat_template == CHATML_TEMPLATE
    text = base.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert text == "<bos>Be brief.\n\nUser: hi\nAssistant: hello\nUser: bye\nAssistant:"


def test_a_base_gguf_is_loaded_with_the_transcript_and_says_so(tmp_path):
    path = make_tiny_gemma3_gguf(tmp_path / "gemma-3-270m.gguf", seed=1)  # no template, no "it"
    loaded = load_model(path)
    assert loaded.tokenizer.chat_template == COMPLETION_TEMPLATE != GEMMA_TEMPLATE
    llm = LLM(model=loaded, device="cpu", num_kv_blocks=16)
    prompt = llm.engine.apply_chat_template(CHAT[1:2])
    assert prompt == "<bos>User: hi\nAssistant:"
    info = EngineInfo.of(llm, EngineSettings(device="cpu"))
    assert info.base_model
    instruct = LLM(model=make_tiny_gemma3_gguf(tmp_path / "g-it.gguf", seed=1), device="cpu")
    assert not EngineInfo.of(instruct, EngineSettings(device="cpu")).base_model


def test_general_finetune_marks_an_instruct_file_whatever_its_file_name(tmp_path):
    tuned = make_named_gguf(tmp_path / "model.gguf", finetune="Instruct", chat_template=None)
    assert load_model(tuned).tokenizer.chat_template is None  # llama: ambiguous, not guessed
    base = make_named_gguf(tmp_path / "model2.gguf", name="Tiny Llama", chat_template=None)
    assert load_model(base).tokenizer.chat_template == COMPLETION_TEMPLATE


def test_completion_params_stop_at_the_next_user_turn_and_keep_the_users_choices():
    params = completion_params({"temperature": 0.7, "repetition_penalty": 1.0, "max_tokens": 64})
    assert params["stop"] == ["\nUser:"] and params["repetition_penalty"] == 1.1
    assert params["temperature"] == 0.7 and params["max_tokens"] == 64
    own = completion_params({"repetition_penalty": 1.3, "stop": "END"})
    assert own["repetition_penalty"] == 1.3 and own["stop"] == ["END", "\nUser:"]
    SamplingParams(**params)  # what the worker builds from them


def test_the_window_says_so_and_replies_completion_style(make_window, qtbot, tmp_path):
    """Switch the running app to a base GGUF: the chat says what it is and the reply it sends
    carries the completion-style stop; back on an instruct file the notice goes."""
    window = make_window()
    assert not window.chats.completion_style.base_model and not window.chat.notice.isVisible()
    base = make_named_gguf(tmp_path / "tiny-base.gguf", name="Tiny", chat_template=None)
    with qtbot.waitSignal(window.engine_ready, timeout=TIMEOUT_MS):
        window.apply_settings(window.settings.with_engine(model=str(base), max_model_len=512))
    assert window.engine_info.base_model
    cid = window.chats.new_conversation()
    assert window.chat.notice.isVisible() and window.chat.notice.text() == BASE_MODEL_NOTICE
    sent = []
    submit = window.client.submit
    window.client.submit = lambda *args: (sent.append(args), submit(*args))
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS) as done:
        window.chats.send_message("Once upon a time", cid)
    assert done.args == [cid, "complete"]
    params = sent[0][3]
    assert "\nUser:" in params["stop"] and params["repetition_penalty"] == 1.1
    assert window.store.conversation(cid).sampling["repetition_penalty"] == 1.0  # kept as set
    assert window.chat.notice.text() == BASE_MODEL_NOTICE  # still there after the reply
    instruct = make_named_gguf(tmp_path / "tiny-instruct.gguf", name="Tiny Instruct")
    with qtbot.waitSignal(window.engine_ready, timeout=TIMEOUT_MS):
        window.apply_settings(window.settings.with_engine(model=str(instruct), max_model_len=512))
    qtbot.waitUntil(lambda: not window.chat.notice.isVisible(), timeout=TIMEOUT_MS)
    assert not window.chats.completion_style.base_model
