"""The max model length a small model's context lowered comes back for a model that allows it,
in a later dialog too: the dialog's note says "lowered from 4,096 to 512", so 512 is the
model's limit, not the user's choice.

Filed by a long drive of the app: after a switch to a 512-token GGUF (the dialog lowered 2,048
to 512 and said so) and Apply, the next dialog's switch back to the bundled model kept 512.
"""

from __future__ import annotations

import json

import pytest
from tiny_models import make_tiny_gguf

from kvscope.app.core.settings import AppSettings, EngineSettings, load_settings, save_settings
from kvscope.app.desktop.settings.dialog import SettingsDialog

CPU = dict(device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A Llama GGUF whose header says 512 tokens of context."""
    return make_tiny_gguf("llama", tmp_path_factory.mktemp("gguf") / "tiny.gguf")[0]


def open_dialog(qtbot, settings: AppSettings) -> SettingsDialog:
    dialog = SettingsDialog(settings)
    qtbot.addWidget(dialog)
    return dialog


def test_a_lowered_length_comes_back_after_apply_and_a_restart(qtbot, tiny_gguf, tmp_path):
    dialog = open_dialog(qtbot, AppSettings(engine=EngineSettings(max_model_len=4096, **CPU)))
    assert dialog.max_len.value() == 4096
    dialog.picker.choose_gguf(str(tiny_gguf))
    assert dialog.max_len.value() == 512
    assert "lowered from 4,096 to 512" in dialog.context_note.text()
    applied = dialog.result_settings()
    assert applied.engine.max_model_len == 512  # what the engine gets: the model's limit
    assert applied.wanted_max_model_len == 4096  # what the user asked for
    # What the window saves and the next session loads.
    save_settings(applied, tmp_path / "settings.json")
    reloaded = load_settings(tmp_path / "settings.json")
    assert reloaded == applied

    dialog = open_dialog(qtbot, reloaded)
    assert dialog.picker.source.currentIndex() == 1 and dialog.max_len.value() == 512
    assert "lowered from 4,096 to 512" in dialog.context_note.text()  # still true, still said
    dialog.picker.source.setCurrentIndex(0)  # the bundled model: 8,192 tokens of context
    assert dialog.max_len.value() == 4096
    assert "At most 8,192 tokens" in dialog.context_note.text()
    back = dialog.result_settings()
    assert back.engine.max_model_len == 4096 and back.wanted_max_model_len is None


def test_a_length_typed_on_the_small_model_is_the_new_choice(qtbot, tiny_gguf):
    settings = AppSettings(
        engine=EngineSettings(model=str(tiny_gguf), max_model_len=512, **CPU),
        wanted_max_model_len=4096,
    )
    dialog = open_dialog(qtbot, settings)
    dialog.max_len.setValue(300)  # the user's own, within this model's context
    assert dialog.result_settings().wanted_max_model_len is None
    dialog.picker.source.setCurrentIndex(0)
    assert dialog.max_len.value() == 300
    assert "lowered" not in dialog.context_note.text()


def test_a_saved_wanted_length_under_the_applied_one_is_not_a_choice(qtbot):
    # A hand-edited or stale value: only a length over the applied one is one a clamp lowered.
    settings = AppSettings(engine=EngineSettings(max_model_len=2048, **CPU), wanted_max_model_len=1)
    dialog = open_dialog(qtbot, settings)
    assert dialog.max_len.value() == 2048
    assert dialog.result_settings().wanted_max_model_len is None


@pytest.mark.parametrize("bad", [0, -5, 2.5, "4096", True])
def test_a_bad_wanted_length_in_the_file_is_named(bad):
    with pytest.raises(ValueError, match=f"wanted_max_model_len must be an int >= 1.*{bad!r}"):
        AppSettings.from_dict({"wanted_max_model_len": bad})


def test_a_file_from_before_the_wanted_length_loads_without_one(tmp_path):
    older = AppSettings().to_dict()
    del older["wanted_max_model_len"]
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(older))
    assert load_settings(path) == AppSettings() and load_settings(path).wanted_max_model_len is None
