"""The model picker finds the GGUF files a user already has, and lists them from headers alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from split_gguf import write_split_gguf
from tiny_models import make_quant_gguf, make_tiny_gguf

from kvscope.app.desktop.models import discovery as model_discovery
from kvscope.app.desktop.models.discovery import SearchRoot, find_gguf_files


@pytest.fixture(scope="module")
def tiny_ggufs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("ggufs")
    return {
        "f32": make_tiny_gguf("llama", folder / "tiny-f32.gguf")[0],
        "q8": make_quant_gguf(folder / "tiny-q8.gguf", "Q8_0"),
    }


def fake_home(home: Path, tiny_ggufs: dict[str, Path]) -> dict[str, Path]:
    """LM Studio's publisher/repo/file layout, a Jan model, ~/models and an Ollama blob."""
    lmstudio = home / ".lmstudio" / "models" / "someone" / "Tiny-GGUF"
    jan = home / "jan" / "models" / "tiny"
    own = home / "models"
    for folder in (lmstudio, jan, own, home / ".ollama" / "models" / "blobs"):
        folder.mkdir(parents=True)
    paths = {
        "lmstudio": lmstudio / "tiny-q8.gguf",
        "jan": jan / "tiny.gguf",
        "own": own / "mine.gguf",
    }
    paths["lmstudio"].write_bytes(tiny_ggufs["q8"].read_bytes())
    paths["jan"].write_bytes(tiny_ggufs["f32"].read_bytes())
    paths["own"].write_bytes(tiny_ggufs["f32"].read_bytes())
    (own / "notes.txt").write_text("not a model")
    (home / ".ollama" / "models" / "blobs" / "sha256-0123").write_bytes(b"GGUF")
    return paths


def test_the_usual_folders_are_searched_and_each_file_is_listed_once(tmp_path, tiny_ggufs):
    paths = fake_home(tmp_path, tiny_ggufs)
    (tmp_path / "models" / "again").symlink_to(tmp_path / "models")  # a loop
    (tmp_path / "models" / "alias.gguf").symlink_to(paths["own"])  # the same file twice
    found = model_discovery.discover(tmp_path / "data", home=tmp_path)
    assert len(found) == 3  # the alias and the loop add nothing
    by_path = {m.path.resolve(): m for m in found}
    assert set(by_path) == {paths["lmstudio"], paths["jan"], paths["own"]}
    assert by_path[paths["lmstudio"]].source == "LM Studio"
    assert by_path[paths["jan"]].source == "Jan"
    assert by_path[paths["lmstudio"]].size_bytes == paths["lmstudio"].stat().st_size
    # A blob no manifest names (a pull that did not finish) is not listed: see test_ollama_models.


def test_a_split_model_is_one_entry_with_every_part_counted(tmp_path, tiny_ggufs):
    parts = write_split_gguf(tiny_ggufs["q8"], tmp_path / "models" / "Tiny-GGUF", max_tensors=8)
    assert len(parts) == 3
    [found] = find_gguf_files([SearchRoot("Models", tmp_path / "models")])
    assert found.path == parts[0]
    assert found.size_bytes == sum(p.stat().st_size for p in parts)
    assert model_discovery.describe(found.path).quantization == "Q8_0"


def test_gpt4all_folder_follows_the_platform(tmp_path, monkeypatch):
    monkeypatch.setattr(model_discovery.sys, "platform", "linux")
    linux = {r.path for r in model_discovery.search_roots(tmp_path)}
    assert tmp_path / ".local" / "share" / "nomic.ai" / "GPT4All" in linux
    monkeypatch.setattr(model_discovery.sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "AppData" / "Local"))
    windows = {r.path for r in model_discovery.search_roots(tmp_path)}
    assert tmp_path / "AppData" / "Local" / "nomic.ai" / "GPT4All" in windows


def test_the_scan_is_bounded_and_skips_what_it_cannot_read(tmp_path, monkeypatch):
    deep = tmp_path / "root"
    folder = deep
    for depth in range(8):
        folder = folder / f"d{depth}"
        folder.mkdir(parents=True)
        (folder / f"m{depth}.gguf").write_bytes(b"x")
    roots = [SearchRoot("Models folder", deep)]
    shallow = find_gguf_files(roots, max_depth=3)  # root, d0, d0/d1
    assert [m.path.name for m in shallow] == ["m0.gguf", "m1.gguf"]
    assert len(find_gguf_files(roots, max_files=2)) == 2
    assert find_gguf_files(roots, budget_s=0.0) == []
    locked = deep / "d0" / "d1"
    real_scandir = os.scandir

    def scandir(path):  # chmod 0 does not stop root, so refuse the way a locked folder does
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(model_discovery.os, "scandir", scandir)
    assert [m.path.name for m in find_gguf_files(roots)] == ["m0.gguf"]
    missing = [SearchRoot("Jan", tmp_path / "nowhere")]
    assert find_gguf_files(missing) == []


def test_describe_reads_name_and_quantization_from_the_header(tmp_path, tiny_ggufs):
    quant = model_discovery.describe(tiny_ggufs["q8"])
    assert quant.quantization == "Q8_0" and not quant.error
    assert model_discovery.describe(tiny_ggufs["f32"]).quantization == "F32"
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\xff" * 40)
    summary = model_discovery.describe(broken)
    assert summary.error and summary.quantization == "" and summary.name == "broken.gguf"


def test_recent_models_are_kept_newest_first_and_survive_damage(tmp_path, tiny_ggufs):
    data = tmp_path / "data"
    data.mkdir()
    assert model_discovery.recent_models(data) == []
    model_discovery.remember_model(data, tiny_ggufs["f32"])
    model_discovery.remember_model(data, tiny_ggufs["q8"])
    model_discovery.remember_model(data, tiny_ggufs["f32"])
    assert model_discovery.recent_models(data) == [tiny_ggufs["f32"], tiny_ggufs["q8"]]
    found = model_discovery.discover(data, home=tmp_path / "empty-home")
    assert [(m.path, m.source) for m in found] == [
        (tiny_ggufs["f32"], "Recent"),
        (tiny_ggufs["q8"], "Recent"),
    ]
    (data / model_discovery.RECENT_FILE).write_text("{not json")
    assert model_discovery.recent_models(data) == []
