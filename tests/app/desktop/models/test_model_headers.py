"""A model's headers are read once per version of its files: the settings dialog read the
bundled GGUF's header twice on every open, on the GUI thread (~200 ms a open here, ~430 ms in
the long drive), though it changes only with the file.
"""

from __future__ import annotations

import logging
import os

import pytest
from tiny_models import make_tiny_gguf, random_model, tiny_config

from kvscope.app.core.settings import AppSettings, EngineSettings
from kvscope.app.desktop.models import headers as model_headers
from kvscope.app.desktop.settings.dialog import SettingsDialog
from kvscope.engine.model.model_config import ModelConfig
from kvscope.engine.sizing import planner


@pytest.fixture
def reads(monkeypatch):
    """Counts the planner's reads of a model's files (the real ones run; a ModelConfig passed
    back in reads nothing) from an empty cache."""
    model_headers.clear()
    counts = {"model_config": 0, "weights_header": 0}
    for name in counts:
        real = getattr(planner, name)

        def counted(model, _real=real, _name=name):
            counts[_name] += not isinstance(model, ModelConfig)
            return _real(model)

        monkeypatch.setattr(planner, name, counted)
    yield counts
    model_headers.clear()


def test_a_file_is_read_once_until_it_changes(tmp_path, reads):
    path = make_tiny_gguf("llama", tmp_path / "m.gguf")[0]
    first = model_headers.read_headers(path)
    assert first == (planner.model_config(path), planner.weights_header(path))
    reads.update(model_config=0, weights_header=0)
    assert model_headers.read_headers(str(path)) == first  # str or Path: the same file
    assert reads == {"model_config": 0, "weights_header": 0}
    # Another model written over it (as a download replaces a file): read again.
    make_tiny_gguf("qwen3", path)
    second_config, _ = model_headers.read_headers(path)
    assert reads == {"model_config": 1, "weights_header": 1}
    assert second_config.architecture == "qwen3" != first[0].architecture
    # The same bytes with a new mtime count as a new version too.
    os.utime(path, ns=(1, 1))
    model_headers.read_headers(path)
    assert reads == {"model_config": 2, "weights_header": 2}


def test_the_shared_header_cannot_be_changed_by_a_caller(tmp_path, reads):
    path = make_tiny_gguf("llama", tmp_path / "m.gguf")[0]
    _, (shapes, kinds) = model_headers.read_headers(path)
    name = next(iter(shapes))
    with pytest.raises(TypeError):
        shapes[name] = (1, 1)
    with pytest.raises(TypeError):
        kinds[name] = "F32"


def test_an_hf_folder_is_read_again_when_its_config_changes(tmp_path, reads):
    folder = tmp_path / "hf"
    random_model(tiny_config("llama", 300), seed=0).save_pretrained(folder)
    config, header = model_headers.read_headers(folder)
    assert config.num_layers == 2 and header is not None
    model_headers.read_headers(folder / "config.json")  # the folder's config.json: its files
    assert reads["model_config"] == 1
    text = (
        (folder / "config.json")
        .read_text()
        .replace('"num_hidden_layers": 2', '"num_hidden_layers": 1')
    )
    (folder / "config.json").write_text(text)
    assert model_headers.read_headers(folder)[0].num_layers == 1
    assert reads["model_config"] == 2


def test_a_failure_is_raised_each_time_and_not_cached(tmp_path, reads):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 64)
    for _ in range(2):
        with pytest.raises(ValueError, match="broken.gguf"):
            model_headers.read_headers(path)
    assert reads["model_config"] == 2
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        model_headers.read_headers(tmp_path / "missing.gguf")
    make_tiny_gguf("llama", path)  # repaired: read
    assert model_headers.read_headers(path)[0].max_position_embeddings == 512


def test_a_reopened_dialog_reads_nothing(qtbot, reads):
    settings = AppSettings(engine=EngineSettings(device="cpu"))  # the bundled model
    for _ in range(3):
        dialog = SettingsDialog(settings)
        qtbot.addWidget(dialog)
        assert "Context length: 8,192 tokens" in dialog.picker.info.text()
        assert dialog.picker.weights_header() is not None
        dialog.close()
    assert reads == {"model_config": 1, "weights_header": 1}


def test_a_prefetch_leaves_the_first_open_nothing_to_read(qtbot, tmp_path, reads, caplog):
    path = make_tiny_gguf("llama", tmp_path / "m.gguf")[0]
    model_headers.prefetch(str(path)).join(timeout=60)
    assert reads == {"model_config": 1, "weights_header": 1}
    dialog = SettingsDialog(AppSettings(engine=EngineSettings(model=str(path), device="cpu")))
    qtbot.addWidget(dialog)
    assert "Context length: 512 tokens" in dialog.picker.info.text()
    assert reads == {"model_config": 1, "weights_header": 1}
    # A prefetch that fails says so in the log; the dialog's own read shows why.
    with caplog.at_level(logging.INFO, logger="kvscope.app.desktop.models.headers"):
        model_headers.prefetch(str(tmp_path / "gone.gguf")).join(timeout=60)
    assert "prefetching the headers of" in caplog.text and "gone.gguf" in caplog.text


def test_the_window_prefetches_its_engine_model_for_the_dialog(make_window, qtbot, reads):
    window = make_window()  # the bundled model
    qtbot.waitUntil(lambda: model_headers.cached(None), timeout=60_000)
    assert reads == {"model_config": 1, "weights_header": 1}
    dialog = window.open_settings()
    assert "Context length: 8,192 tokens" in dialog.picker.info.text()
    assert reads == {"model_config": 1, "weights_header": 1}  # the first open read nothing
    dialog.reject()
