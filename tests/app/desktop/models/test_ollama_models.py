"""Ollama's models are listed by name and tag and open like any GGUF file (issue 29, item 7).

The fake Ollama folder is laid out as Ollama writes it (ollama/ollama server/manifest.go,
GetBlobsPath): manifests/<host>/<namespace>/<model>/<tag> JSON, the model layer's digest naming
blobs/sha256-<hex>, a real (tiny, synthetic) GGUF in that blob.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from named_ggufs import add_to_ollama, make_named_gguf

from kvscope.app.desktop.models import discovery as model_discovery
from kvscope.app.desktop.models.ollama import (
    display_name,
    name_of_blob,
    ollama_models,
    ollama_models_dir,
)
from kvscope.engine import LLM
from kvscope.engine.model.gguf.identity import is_gguf_file
from kvscope.engine.sizing import planner

TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def ollama_tree(tmp_path_factory) -> dict[str, Path]:
    """Two tags of one blob, a user's namespace, and the damage a real folder can hold."""
    root = tmp_path_factory.mktemp("ollama")
    models = root / "models"
    gemma = make_named_gguf(root / "gemma.gguf", name="Gemma 3 270m It", finetune="it")
    base = make_named_gguf(root / "base.gguf", name="Tiny", chat_template=None, seed=1)
    blob = add_to_ollama(models, gemma, "gemma3", "270m")
    add_to_ollama(models, gemma, "gemma3", "latest")
    other = add_to_ollama(models, base, "tiny", "base", namespace="someone")
    manifests = models / "manifests" / "registry.ollama.ai" / "library"
    (manifests / "gone").mkdir()
    gone = json.loads((manifests / "gemma3" / "270m").read_text())
    gone["layers"][0]["digest"] = "sha256:" + "f" * 64  # a pull that never finished
    (manifests / "gone" / "latest").write_text(json.dumps(gone))
    (manifests / "broken").mkdir()
    (manifests / "broken" / "latest").write_text("{not json")
    (manifests / "odd").mkdir()
    (manifests / "odd" / "latest").write_text(json.dumps({"layers": [{"digest": "../../x"}]}))
    evil = json.loads((manifests / "gemma3" / "270m").read_text())
    evil["layers"][0]["digest"] = "sha256:../../../../etc/passwd"
    (manifests / "evil").mkdir()
    (manifests / "evil" / "latest").write_text(json.dumps(evil))
    return {"models": models, "blob": blob, "other": other}


def test_models_are_listed_by_name_and_tag(ollama_tree):
    found = ollama_models(ollama_tree["models"])
    assert [(m.name, m.blob) for m in found] == [
        ("gemma3:270m, gemma3:latest", ollama_tree["blob"].resolve()),  # one blob, one row
        ("someone/tiny:base", ollama_tree["other"].resolve()),
    ]
    assert found[0].size_bytes == ollama_tree["blob"].stat().st_size
    assert display_name("hf.co", "org", "repo-GGUF", "Q4_K_M") == "hf.co/org/repo-GGUF:Q4_K_M"
    assert ollama_models(ollama_tree["models"].parent / "nowhere") == []


def test_ollama_models_env_is_read_as_ollama_reads_it(tmp_path):
    assert ollama_models_dir(tmp_path, {}) == tmp_path / ".ollama" / "models"
    assert ollama_models_dir(tmp_path, {"OLLAMA_MODELS": ' "/srv/ollama" '}) == Path("/srv/ollama")
    assert ollama_models_dir(tmp_path, {"OLLAMA_MODELS": "  "}) == tmp_path / ".ollama" / "models"


def test_discover_lists_them_under_ollama_and_reads_their_headers(ollama_tree, tmp_path):
    environ = {"OLLAMA_MODELS": str(ollama_tree["models"])}
    found = model_discovery.discover(tmp_path / "data", home=tmp_path, environ=environ)
    assert [(m.title, m.source) for m in found] == [
        ("gemma3:270m, gemma3:latest", "Ollama"),
        ("someone/tiny:base", "Ollama"),
    ]
    summary = model_discovery.describe(found[0].path)
    assert summary.quantization == "Q4_K_M" and not summary.error
    # Opened once, it comes back under Recent with its Ollama name, not its hash.
    model_discovery.remember_model(tmp_path / "data", ollama_tree["blob"])
    again = model_discovery.discover(tmp_path / "data", home=tmp_path, environ=environ)
    assert [(m.title, m.source) for m in again] == [
        ("gemma3:270m, gemma3:latest", "Recent"),
        ("someone/tiny:base", "Ollama"),
    ]


def test_a_blob_is_gguf_by_its_magic_and_loads(ollama_tree):
    blob = ollama_tree["blob"]
    assert blob.suffix == "" and is_gguf_file(blob)
    assert not is_gguf_file(blob.parent / f"sha256-{'0' * 64}")  # the template layer: text
    assert planner.model_config(blob).num_layers == 2
    assert name_of_blob(blob) == "gemma3:270m, gemma3:latest"
    assert name_of_blob(blob.parent.parent.parent / "gemma.gguf") == ""
    llm = LLM(model=str(blob), device="cpu", num_kv_blocks=16)
    assert len(llm.generate(["hi"])[0].outputs[0].token_ids) > 0


def test_the_picker_lists_and_opens_an_ollama_model(qtbot, ollama_tree, tmp_path, monkeypatch):
    from kvscope.app.core.settings import AppSettings, EngineSettings
    from kvscope.app.desktop.settings.dialog import SettingsDialog

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OLLAMA_MODELS", str(ollama_tree["models"]))
    # a data dir of its own: the worker's shared one lists other tests' recent models first
    monkeypatch.setenv("KVSCOPE_DATA_DIR", str(tmp_path / "data"))
    dialog = SettingsDialog(AppSettings(engine=EngineSettings(device="cpu", kv_budget_mib=64)))
    qtbot.addWidget(dialog)
    listing = dialog.picker.found
    qtbot.waitUntil(lambda: listing.scan_done, timeout=TIMEOUT_MS)
    rows = [
        [listing.tree.topLevelItem(i).text(c) for c in range(4)]
        for i in range(listing.tree.topLevelItemCount())
    ]
    assert rows[0][0] == "gemma3:270m, gemma3:latest" and rows[0][2:] == ["Q4_K_M", "Ollama"]
    assert "Ollama keeps" not in listing.status.text()  # the old "cannot list them" note
    listing.tree.itemClicked.emit(listing.tree.topLevelItem(0), 0)
    assert dialog.picker.source.currentIndex() == 1  # "GGUF file", though it has no suffix
    assert dialog.result_settings().engine.model == str(ollama_tree["blob"])
    assert "<b>gemma3:270m, gemma3:latest</b>" in dialog.picker.info.text()
    assert not dialog.picker.error.text()
    # Reopened on that model, the dialog still calls it a GGUF file.
    engine = EngineSettings(device="cpu", kv_budget_mib=64, model=str(ollama_tree["blob"]))
    reopened = SettingsDialog(AppSettings(engine=engine))
    qtbot.addWidget(reopened)
    assert reopened.picker.source.currentIndex() == 1
