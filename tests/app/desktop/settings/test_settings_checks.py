"""The settings dialog refuses what would fail the build, before Apply, and each refusal is one
the engine really makes (the same settings are built and fail).

Filed: the dialog showed "Context length: 2,048" for a GGUF and accepted 4,096; the rebuild
then failed with a bare dialog, and the reopened dialog had forgotten the chosen file.
"""

from __future__ import annotations

import re

import pytest
from pool_sentences import check_sentences
from tiny_gemma3 import make_tiny_gemma3_gguf
from tiny_models import make_tiny_gguf

import kvscope.engine.sizing.model_build as model_build
import kvscope.engine.sizing.weight_fit as weight_fit
from kvscope.app.core.settings import AppSettings, EngineSettings
from kvscope.app.desktop.settings.build_check import build_problems
from kvscope.app.desktop.settings.dialog import SettingsDialog
from kvscope.engine import LLM
from kvscope.engine.model.model_config import FULL, SLIDING, ModelConfig
from kvscope.engine.sizing import planner

TIMEOUT_MS = 120_000
CPU = dict(device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A Llama GGUF whose header says 512 tokens of context."""
    return make_tiny_gguf("llama", tmp_path_factory.mktemp("gguf") / "tiny.gguf")[0]


def open_dialog(qtbot, **engine) -> SettingsDialog:
    dialog = SettingsDialog(AppSettings(engine=EngineSettings(**engine)))
    qtbot.addWidget(dialog)
    return dialog


def applies(dialog: SettingsDialog) -> bool:
    """Press Apply: whether the dialog accepted (it stays open with a sentence when not)."""
    accepted = []
    dialog.accepted.connect(lambda: accepted.append(True))
    dialog._accept()
    return bool(accepted)


def test_max_length_is_clamped_to_the_gguf_context_and_said(qtbot, tiny_gguf):
    dialog = open_dialog(qtbot, model=str(tiny_gguf), max_model_len=4096, **CPU)
    assert "Context length: 512 tokens" in dialog.picker.info.text()
    assert dialog.max_len.maximum() == 512 and dialog.max_len.value() == 512
    assert "lowered from 4,096 to 512" in dialog.context_note.text()
    dialog.max_len.setValue(4096)  # typing more stops at the model's own
    assert dialog.engine_settings().max_model_len == 512
    assert not dialog.problems() and applies(dialog)
    settings = dialog.result_settings().engine
    llm = LLM(model=settings.model, **settings.llm_kwargs())  # what was applied builds
    assert llm.engine.max_model_len == 512
    # The bundled model's 8,192 lets the choice back up: the clamp is not the user's choice.
    dialog = open_dialog(qtbot, model=str(tiny_gguf), max_model_len=4096, **CPU)
    dialog.picker.source.setCurrentIndex(0)
    assert dialog.max_len.value() == 4096 and dialog.max_len.maximum() == 8192
    assert "At most 8,192 tokens" in dialog.context_note.text()


def test_a_max_length_over_the_context_is_named_and_fails_the_build(tiny_gguf):
    mc = planner.model_config(tiny_gguf)
    settings = EngineSettings(model=str(tiny_gguf), max_model_len=4096, **CPU)
    [problem] = build_problems(settings, mc, planner.weights_header(tiny_gguf))
    assert "Max model length 4,096" in problem and "context length 512" in problem
    with pytest.raises(ValueError, match="max_model_len 4096 exceeds .* 512"):
        LLM(model=settings.model, **settings.llm_kwargs())


def test_a_kv_budget_under_one_block_is_refused_and_fails_the_build(qtbot, default_model):
    # The bundled model at float32: 30 layers x 3 KV heads x 64 x 2 x 4 B x 128 tokens = 5.6 MiB.
    dialog = open_dialog(qtbot, kv_budget_mib=1, block_size=128, **CPU)
    [problem] = dialog.problems()
    assert "KV budget of 1 MiB is smaller than one block of 128 tokens" in problem
    assert "5,898,240 B" in problem and "raise it to 6 MiB" in problem
    assert not applies(dialog) and problem in dialog.error.text()
    with pytest.raises(ValueError, match="smaller than one block"):
        LLM(model=default_model, **dialog.result_settings().engine.llm_kwargs())
    dialog.kv_mib.setValue(6)
    assert not dialog.problems() and applies(dialog)


def test_a_pool_without_room_for_one_sequence_is_refused(tmp_path):
    """A hybrid model needs a block in every KV group before it can hold one token: the
    engine builds such a pool but its max_seq_len is 0 and every request fails."""
    gemma = make_tiny_gemma3_gguf(tmp_path / "gemma.gguf", seed=1)
    llm = LLM(model=str(gemma), num_kv_blocks=3, **CPU)
    assert llm.engine.max_seq_len == 0 and llm.engine.kv_layout.num_groups == 7
    with pytest.raises(ValueError, match="cannot fit the KV pool"):
        llm.generate(["hi"])
    # A big hybrid model (48 layers, 8 per group, 6 groups): a block is 32 MiB, 100 MiB 3 blocks.
    types = tuple(FULL if i % 6 == 5 else SLIDING for i in range(48))
    mc = ModelConfig(
        "gemma3", 1000, 64, 128, 48, 16, 16, 256, 1e-6, 1e4, 8192, True,
        sliding_window=1024, layer_types=types,
    )  # fmt: skip
    settings = EngineSettings(kv_budget_mib=100, block_size=128, **CPU)
    [problem] = build_problems(settings, mc, None)
    assert "holds 3 blocks, fewer than the 6 one sequence needs" in problem


def test_weights_that_do_not_fit_are_refused_and_fail_the_build(qtbot, tiny_gguf, monkeypatch):
    free = 100 << 20  # less than the 600 MiB runtime the engine counts on a CPU
    monkeypatch.setattr(weight_fit, "free_memory", lambda device: free)
    monkeypatch.setattr(model_build, "free_memory", lambda device: free)
    dialog = open_dialog(qtbot, model=str(tiny_gguf), kv_budget_mib=64, **CPU)
    [problem] = dialog.problems()
    assert re.search(r"needs \d+\.\d\d GiB of RAM to load .* but 0\.10 GiB is free", problem)
    assert not applies(dialog)
    settings = dialog.result_settings().engine
    with pytest.raises(ValueError, match="needs about .* to load"):
        LLM(model=settings.model, **settings.llm_kwargs())


def test_an_unreadable_or_missing_model_is_refused(qtbot, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    for path in (bad, tmp_path / "missing.gguf"):
        dialog = open_dialog(qtbot, model=str(path), **CPU)
        assert not applies(dialog)
        assert f"The model at {path} cannot be read" in dialog.error.text()
    dialog = open_dialog(qtbot, **CPU)
    dialog.picker.source.setCurrentIndex(1)  # a GGUF file, none chosen
    assert not applies(dialog) and "Choose a model file" in dialog.error.text()


def test_the_hybrid_prediction_adds_up_and_is_the_pool_built(qtbot, tmp_path):
    """The tiny Gemma 3 GGUF (7 KV groups): the dialog's sentence parses back, and the engine
    built from the dialog's settings has the blocks it states."""
    gemma = make_tiny_gemma3_gguf(tmp_path / "gemma.gguf", seed=1)
    dialog = open_dialog(qtbot, model=str(gemma), kv_budget_mib=1, max_model_len=256, **CPU)
    text = dialog.picker.prediction.text()
    mc = planner.model_config(gemma)
    blocks, per_context = check_sentences(text, mc, "fp32", 1 << 20, 256)
    settings = dialog.result_settings().engine
    llm = LLM(model=settings.model, **settings.llm_kwargs())
    assert llm.stats()["kv_blocks_total"] == blocks
    assert llm.engine.kv_layout.max_blocks_held(256, 1) == per_context


def test_a_failed_rebuild_reopens_the_dialog_on_the_chosen_file(make_window, qtbot, tiny_gguf):
    window = make_window()
    chosen = window.settings.with_engine(model=str(tiny_gguf), max_model_len=4096)
    with (
        qtbot.waitSignal(window.engine_failed, timeout=TIMEOUT_MS) as failed,
        qtbot.waitSignal(window.engine_ready, timeout=TIMEOUT_MS),  # the previous one, back
    ):
        window.apply_settings(chosen)  # past the dialog: the engine refuses it
    assert "exceeds the model's context length 512" in failed.args[0]
    assert window.settings.engine.model is None
    window._error_box.close()
    dialog = window.open_settings()
    assert dialog.picker.path.text() == str(tiny_gguf)
    assert dialog.picker.source.currentIndex() == 1
    assert "The last Apply failed" in dialog.error.text() and "512" in dialog.error.text()
    assert dialog.max_len.value() == 512  # and this time it is clamped
    with qtbot.waitSignal(window.engine_ready, timeout=TIMEOUT_MS) as ready:
        assert applies(dialog)
    assert ready.args[0].max_model_len == 512 and ready.args[0].settings.model == str(tiny_gguf)
    dialog = window.open_settings()  # the failure is past: nothing to repeat
    assert "failed" not in dialog.error.text()
    dialog.reject()
