"""The picker labels a file by its own quantization and keeps its name readable (issue 29, 4-5).

A Q4_K_M file whose large embedding is Q8_0 (Gemma 3 270M) was listed as "Q8_0", and the
dialog's narrow name column showed "ge…uf".
"""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from named_ggufs import make_named_gguf
from PySide6.QtCore import QRect, Qt

from kvscope.app.core.settings import AppSettings, EngineSettings
from kvscope.app.desktop.elided_label import ElidedLabel, elide_middle
from kvscope.app.desktop.models import discovery as model_discovery
from kvscope.engine.model.gguf.identity import dominant_layer_type, file_type_label

TIMEOUT_MS = 60_000
GEMMA_FILE = "gemma-3-270m-it-Q4_K_M.gguf"


@pytest.fixture(scope="module")
def gemma_like(tmp_path_factory) -> Path:
    """llama.cpp's Q4_K_M mix where the embedding outweighs the layers, as in Gemma 3 270M."""
    folder = tmp_path_factory.mktemp("lmstudio") / "lmstudio-community" / "gemma-3-270m-it-GGUF"
    folder.mkdir(parents=True)
    return make_named_gguf(folder / GEMMA_FILE, name="Gemma 3 270m It", extra_vocab=8192)


def test_the_label_is_the_files_own_type_not_the_biggest_tensors(gemma_like):
    summary = model_discovery.describe(gemma_like)
    assert summary.quantization == "Q4_K_M" and not summary.error
    assert "general.file_type 15" in summary.details and "Gemma 3 270m It" in summary.details


def test_without_a_file_type_the_layers_decide_and_say_so(tmp_path):
    path = make_named_gguf(tmp_path / "no-type.gguf", file_type=None, extra_vocab=8192)
    summary = model_discovery.describe(path)
    assert summary.quantization == "Q4_K"  # the layers' type, not the embedding's Q8_0
    assert "no general.file_type" in summary.details
    guessed = int(gguf.LlamaFileType.MOSTLY_Q4_K_M) | int(gguf.LlamaFileType.GUESSED)
    assert file_type_label({"general.file_type": guessed}) == ""  # a guess is not the file's
    assert file_type_label({"general.file_type": 7}) == "Q8_0"
    assert file_type_label({"general.file_type": 0}) == "F32"
    assert file_type_label({"general.file_type": 9999}) == ""
    shapes = {"model.embed_tokens.weight": (9000, 256), "model.layers.0.mlp.up_proj.weight": (8, 8)}
    kinds = {"model.embed_tokens.weight": "Q8_0", "model.layers.0.mlp.up_proj.weight": "Q4_K"}
    assert dominant_layer_type(shapes, kinds) == "Q4_K"


def test_elide_middle_keeps_the_model_and_its_quantization():
    assert elide_middle(GEMMA_FILE, 24) == "gemma-3-270m…Q4_K_M.gguf"
    assert len(elide_middle(GEMMA_FILE, 23)) == 23
    assert elide_middle("short.gguf", 22) == "short.gguf"
    with pytest.raises(ValueError, match="at least 3, got 2"):
        elide_middle(GEMMA_FILE, 2)


def test_an_elided_label_can_elide_in_the_middle(qtbot):
    label = ElidedLabel(GEMMA_FILE, elide=Qt.ElideMiddle)
    qtbot.addWidget(label)
    label.resize(label.fontMetrics().horizontalAdvance(GEMMA_FILE) // 2, 20)
    shown = label.shown_text()
    assert label.is_elided() and "…" in shown
    assert shown.startswith("gemma") and shown.endswith(".gguf")


def test_the_picker_shows_readable_names_and_the_files_own_type(
    qtbot, gemma_like, tmp_path, monkeypatch
):
    from kvscope.app.desktop.settings.dialog import SettingsDialog

    home = tmp_path / "home"
    (home / ".lmstudio").mkdir(parents=True)
    (home / ".lmstudio" / "models").symlink_to(gemma_like.parents[2])
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    # a data dir of its own: the worker's shared one lists other tests' recent models first
    monkeypatch.setenv("KVSCOPE_DATA_DIR", str(tmp_path / "data"))
    from kvscope.app.desktop.theme import theme_keeper

    theme_keeper().apply("dark")  # the app's own style sheet: its padding narrows the columns
    dialog = SettingsDialog(AppSettings(engine=EngineSettings(device="cpu", kv_budget_mib=64)))
    qtbot.addWidget(dialog)
    listing = dialog.picker.found
    qtbot.waitUntil(lambda: listing.scan_done, timeout=TIMEOUT_MS)
    item = listing.tree.topLevelItem(0)
    assert item.text(0) == GEMMA_FILE and item.text(2) == "Q4_K_M"
    listed = home / ".lmstudio" / "models" / gemma_like.relative_to(gemma_like.parents[2])
    assert str(listed) in item.toolTip(0) and "Gemma 3 270m It" in item.toolTip(0)
    dialog.resize(dialog.minimumSizeHint())  # the narrowest the dialog gets
    dialog.show()
    qtbot.waitExposed(dialog)
    # What the name column paints: the model and its quantization both readable.
    tree = listing.tree
    width = tree.columnWidth(0) - 12  # the cell's margins
    shown = tree.fontMetrics().elidedText(item.text(0), Qt.ElideMiddle, width)
    assert shown.startswith("gemma-3-") and shown.endswith("Q4_K_M.gguf"), shown
    # Every column inside the Model box (the place column ran off its edge at 1024 px).
    tree_right = tree.mapTo(dialog.picker, tree.rect().topRight()).x()
    assert tree_right <= dialog.picker.contentsRect().right(), (tree_right, dialog.picker.width())
    assert tree.header().length() <= tree.viewport().width()
    # The list's status line and the model info below it never overlap.
    listing.tree.itemClicked.emit(item, 0)
    qtbot.waitUntil(lambda: "2 layers" in dialog.picker.info.text(), timeout=TIMEOUT_MS)
    status, info = listing.status, dialog.picker.info
    status_rect = QRect(status.mapTo(dialog, status.rect().topLeft()), status.size())
    info_rect = QRect(info.mapTo(dialog, info.rect().topLeft()), info.size())
    assert not status_rect.intersects(info_rect)
    assert status.height() >= status.heightForWidth(status.width())
