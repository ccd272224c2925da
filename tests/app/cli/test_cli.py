"""The `kvscope` command line: generate, chat and the demo window, as a user runs them."""

import io
import os
import subprocess

import pytest

from kvscope.app.cli import terminal
from kvscope.app.cli.main import build_parser
from kvscope.app.core import engine_flags
from kvscope.engine.child_python import python_module_command


def _args(argv):
    return build_parser().parse_args(argv)


@pytest.fixture()
def patched_llm(monkeypatch, default_model):
    """The CLI builds its own LLM from a path; hand it the session's preloaded model instead."""
    real = terminal.llm_from_args

    def with_loaded(args):
        args.model = default_model
        return real(args)

    monkeypatch.setattr(terminal, "llm_from_args", with_loaded)


def test_generate_streams_the_completion(patched_llm, capsys):
    args = _args(["generate", "What is the capital of France?", "--chat", "--max-tokens", "12"])
    assert terminal.run(args) == 0
    assert "Paris" in capsys.readouterr().out


def test_generate_reports_bad_input_without_a_traceback(patched_llm, capsys):
    assert terminal.run(_args(["generate", "", "--max-tokens", "4"])) == 2
    assert "error: prompt is empty" in capsys.readouterr().err


def test_bad_sampling_flag_is_a_clear_error(patched_llm, capsys):
    assert terminal.run(_args(["generate", "hi", "--temperature", "-1"])) == 2
    assert "temperature" in capsys.readouterr().err


def test_chat_keeps_the_conversation(patched_llm, monkeypatch, capsys):
    prompts, real_stream = [], terminal.stream

    def recording_stream(llm, prompt, params, out=None):
        prompts.append(prompt)
        return real_stream(llm, prompt, params, out)

    monkeypatch.setattr(terminal, "stream", recording_stream)
    monkeypatch.setattr("sys.stdin", io.StringIO("My name is Ada.\nWhat is my name?\n\n"))
    assert terminal.run(_args(["chat", "--max-tokens", "16", "--system", "Be brief."])) == 0
    out = capsys.readouterr().out
    assert out.count("assistant> ") == 2
    first_reply = out.split("assistant> ")[1].split("\nyou> ")[0].strip()
    # The second turn's prompt carries the system prompt, the first exchange and the new question.
    second = prompts[1]
    assert second.index("Be brief.") < second.index("My name is Ada.") < second.index(first_reply)
    assert second.index(first_reply) < second.index("What is my name?")


def test_demo_window_saves_a_screenshot(tmp_path):
    png = tmp_path / "window.png"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "KVSCOPE_DATA_DIR": str(tmp_path)}
    cmd = python_module_command("kvscope.app.cli", "--demo", "2", "--screenshot", str(png))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The demo chats are real conversations, stored like any other.
    from kvscope.app.desktop.chat.store import ChatStore

    store = ChatStore(tmp_path / "chats.sqlite3")
    chats = store.conversations()
    assert len(chats) == 2
    for chat in chats:
        assert [m.role for m in store.messages(chat.id)] == ["user", "assistant"]
    store.close()


# The engine flags (by dest) the terminal commands have always taken, with their defaults.
ENGINE_FLAGS = {
    "model": None,
    "device": "auto",
    "dtype": "auto",
    "block_size": 16,
    "max_model_len": None,
    "max_num_seqs": 64,
    "num_kv_blocks": None,
    "quantization": "auto",
    "num_threads": None,
}
# The other user knobs are for LLM and the app's settings (seed: --seed is the sampling seed).
NOT_ON_THE_COMMAND_LINE = {
    "kv_cache_dtype",
    "kv_cache_memory",
    "gpu_memory_utilization",
    "max_num_batched_tokens",
    "enable_prefix_caching",
    "allocator",
    "seed",
    "cpu_quant_kernel",
}


def test_every_engine_knob_is_a_flag_with_its_default_or_listed_as_none():
    from kvscope.engine.config import user_knobs

    knobs = {f.name: f.default for f in user_knobs()}
    assert set(knobs) == set(ENGINE_FLAGS) | NOT_ON_THE_COMMAND_LINE
    assert {name: knobs[name] for name in ENGINE_FLAGS} == ENGINE_FLAGS


@pytest.mark.parametrize("argv", [["generate", "hi"], ["chat"], ["record", "out.jsonl"]])
def test_the_engine_flags_keep_their_defaults(argv):
    parsed = vars(_args(argv))
    assert {name: parsed[name] for name in ENGINE_FLAGS} == ENGINE_FLAGS
    assert not (NOT_ON_THE_COMMAND_LINE - {"seed"}) & set(parsed)  # no flag for those


def test_every_engine_flag_reaches_llm(monkeypatch):
    built = {}
    monkeypatch.setattr(engine_flags, "LLM", lambda **kwargs: built.update(kwargs))
    argv = ["generate", "hi", "--model", "m.gguf", "--device", "cpu", "--dtype", "float32"]
    argv += ["--block-size", "32", "--max-model-len", "128", "--max-num-seqs", "3"]
    argv += ["--num-kv-blocks", "9", "--quantization", "none", "--seed", "5"]
    argv += ["--num-threads", "1"]
    engine_flags.llm_from_args(_args(argv))
    assert built == {
        "model": "m.gguf",
        "device": "cpu",
        "dtype": "float32",
        "block_size": 32,
        "max_model_len": 128,
        "max_num_seqs": 3,
        "num_kv_blocks": 9,
        "quantization": "none",
        "num_threads": 1,
    }  # --seed went to the sampling params, not to the engine


def test_a_value_outside_a_knobs_choices_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exited:
        _args(["generate", "hi", "--block-size", "7"])
    assert exited.value.code == 2
    assert "--block-size: invalid choice: 7" in capsys.readouterr().err
