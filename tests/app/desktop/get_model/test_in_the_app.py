"""The Get a model window in the app: Engine ▸ Get a model…, the model picker's button and its
Hugging Face cache rows, Open loading a download into the engine, and the first-run offer of
the curated models that fit while the bundled model runs."""

from pathlib import Path

from fake_hub import FakeHub
from PySide6.QtWidgets import QMessageBox, QPushButton

from kvscope.app.core.hub.curated import CURATED_MODELS
from kvscope.app.core.hub.pull import Pull
from kvscope.app.desktop.models.discovery import HUB_CACHE_LABEL

REPO = "org/Tiny-GGUF"
FILE = "Tiny-F32.gguf"


def engine_menu_texts(window) -> list[str]:
    [engine] = [a.menu() for a in window.menuBar().actions() if a.text() == "&Engine"]
    return [a.text() for a in engine.actions() if not a.isSeparator()]


def test_open_loads_a_downloaded_model_into_the_engine(
    make_window, fake_hub: FakeHub, tiny_gguf: bytes, qtbot
) -> None:
    fake_hub.add_repo(REPO, {FILE: tiny_gguf}, downloads=10, license="mit")
    window = make_window(max_tokens=2000)
    texts = engine_menu_texts(window)
    assert texts[texts.index("Model and engine…") + 1] == "Get a model…"
    window.get_model.action.trigger()
    get = window.get_model.hub_window
    assert get is not None and get.isVisible()
    get.search_box.setText("tiny")
    get.search_button.click()
    table = get.files.table
    qtbot.waitUntil(lambda: table.rowCount() == 1, timeout=10_000)
    table.download_button((REPO, FILE)).click()
    [row] = get.downloads.rows()
    qtbot.waitUntil(lambda: row.state == "done", timeout=15_000)
    assert window.engine_info.settings.model is None  # still the bundled model
    # A reply streams: loading would stop it, so Open asks first, without blocking the chat.
    window.chats.send_message("Write a long story about a dragon.")
    row.open_button.click()
    qtbot.waitUntil(lambda: window.findChild(QMessageBox, "openModelQuestion") is not None)
    question = window.findChild(QMessageBox, "openModelQuestion")
    assert "still being generated" in question.text()
    qtbot.wait(300)
    assert window.chats.pending and window.engine_info.settings.model is None
    question.button(QMessageBox.StandardButton.Yes).click()
    qtbot.waitUntil(lambda: window.engine_info.settings.model == row.path, timeout=60_000)
    assert window.settings.engine.model == row.path
    assert window.engine_info.max_model_len == 512  # the tiny model's own context
    assert not window.get_model.first_run.isVisible()  # the user's own model runs now


def test_the_model_picker_lists_the_hf_cache_and_opens_get_a_model(
    make_window, fake_hub: FakeHub, tiny_gguf: bytes, qtbot
) -> None:
    fake_hub.add_repo(REPO, {FILE: tiny_gguf})
    pulled = Pull(REPO, file=FILE).run()
    window = make_window()
    # No curated repo is on this hub: the bundled model runs and nothing is offered.
    offer = window.get_model.first_run
    qtbot.waitUntil(lambda: not offer.checking, timeout=20_000)
    assert offer.fits == [] and not offer.isVisible()
    dialog = window.open_settings()
    picker = dialog.picker
    qtbot.waitUntil(lambda: str(pulled) in picker.found.paths(), timeout=10_000)
    row = picker.found.paths().index(str(pulled))
    assert picker.found.tree.topLevelItem(row).text(3) == HUB_CACHE_LABEL
    assert picker.get_model.isEnabled()
    picker.get_model.click()
    qtbot.waitUntil(lambda: not dialog.isVisible())
    assert window.get_model.hub_window is not None and window.get_model.hub_window.isVisible()


def test_first_run_offers_the_curated_models_that_fit_and_downloads_one(
    make_window, fake_hub: FakeHub, tiny_gguf: bytes, q4_gguf: bytes, qtbot
) -> None:
    offered = CURATED_MODELS[:3]
    # Two with llama.cpp's default quant, one with only Q8_0; the other curated repos are
    # missing from this hub (a 404 each), so they are not offered.
    fake_hub.add_repo(offered[0].repo, {"small-Q4_K_M.gguf": q4_gguf, "small-Q8_0.gguf": tiny_gguf})
    fake_hub.add_repo(offered[1].repo, {"model-Q4_K_M.gguf": q4_gguf})
    fake_hub.add_repo(offered[2].repo, {"model-Q8_0.gguf": tiny_gguf})
    window = make_window()
    offer = window.get_model.first_run
    chat = window.chat
    assert chat.message_layout.indexOf(offer) == chat.message_layout.indexOf(chat.empty) + 1
    qtbot.waitUntil(lambda: offer.isVisible(), timeout=20_000)
    assert [(fit.hub_file.repo, fit.hub_file.file) for fit in offer.fits] == [
        (offered[0].repo, "small-Q4_K_M.gguf"),
        (offered[1].repo, "model-Q4_K_M.gguf"),
        (offered[2].repo, "model-Q8_0.gguf"),
    ]
    assert all(fit.verdict.fits for fit in offer.fits)
    assert [fit.title for fit in offer.fits] == [m.description.split(":")[0] for m in offered]
    assert "bigger models than the bundled SmolLM2-135M" in offer.title.text()
    buttons = [b for b in offer.findChildren(QPushButton) if b.text() == "Download"]
    assert len(buttons) == 3
    buttons[1].click()
    get = window.get_model.hub_window
    assert get is not None and get.isVisible()
    assert get.files.title.text() == offered[1].repo
    [row] = get.downloads.rows()
    assert (row.task.repo, row.task.file) == (offered[1].repo, "model-Q4_K_M.gguf")
    qtbot.waitUntil(lambda: row.state == "done", timeout=15_000)
    assert Path(row.path).read_bytes() == q4_gguf
    # The offer stands beside an empty chat only.
    chat.empty.setVisible(False)
    assert not offer.isVisible()
    chat.empty.setVisible(True)
    assert offer.isVisible()
    offer.dismiss()
    assert not offer.isVisible()
