"""The Get a model window's search: the curated list before typing, results with the hub's
figures, verdicts read lazily off the GUI thread, split GGUFs as one row, errors in words."""

import time
from pathlib import Path

from fake_hub import FakeHub
from huggingface_hub import constants
from PySide6.QtCore import QTimer
from split_gguf import write_split_gguf

from kvscope.app.core.hub.curated import CURATED_MODELS
from kvscope.app.desktop.get_model.file_table import VERDICT
from kvscope.app.desktop.get_model.texts import CHECKING

REPO = "org/Tiny-GGUF"
QUANTS = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q3_K_L", "IQ4_XS")
HEADER_WAIT_S = 0.4  # each header read waits this long at the hub (a slow network)


def verdict_cells(window) -> list[str]:
    table = window.files.table
    return [table.item(row, VERDICT).text() for row in range(table.rowCount())]


def judged_files(hub: FakeHub) -> set[str]:
    """The files whose content the hub served (a header read is a Range GET of the file)."""
    return {
        r.path.rsplit("/", 1)[-1]
        for r in hub.requests
        if r.method == "GET" and "/resolve/" in r.path
    }


def test_before_typing_the_window_lists_the_curated_models_with_their_licences(
    fake_hub: FakeHub, q4_gguf: bytes, qtbot
) -> None:
    from kvscope.app.desktop.get_model.window import GetModelWindow

    first = CURATED_MODELS[0]
    files = {"qwen2.5-0.5b-instruct-q4_k_m.gguf": q4_gguf}
    fake_hub.add_repo(first.repo, files, license=first.license)
    window = GetModelWindow()  # it lists the first curated repo's files as it opens
    qtbot.addWidget(window)
    window.show()
    assert [r.repo for r in window.repos.repos()] == [m.repo for m in CURATED_MODELS]
    second_lines = [window.repos.item(i).text().split("\n")[1] for i in range(window.repos.count())]
    assert second_lines == [m.license for m in CURATED_MODELS]
    assert window.files.title.text() == first.repo
    assert first.description in window.files.meta.text()
    # The first repo's files were listed from the hub and their verdicts read in view.
    qtbot.waitUntil(lambda: verdict_cells(window)[:1] not in ([], [""], [CHECKING]))
    assert verdict_cells(window)[0].startswith("✓ fits")
    window.shutdown()


def test_search_shows_repos_and_verdicts_while_the_event_loop_keeps_turning(
    get_model_window, fake_hub: FakeHub, q4_gguf: bytes, qtbot
) -> None:
    files = {f"Tiny-{q}.gguf": q4_gguf for q in QUANTS} | {"README.md": b"# Tiny"}
    fake_hub.add_repo(REPO, files, downloads=1_234_567, likes=890, license="apache-2.0")
    for name in files:
        fake_hub.set_faults(REPO, name, stall_after_bytes=0, stall_s=HEADER_WAIT_S, times=100)
    window = get_model_window
    ticks: list[float] = []
    timer = QTimer(interval=10)
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start()
    window.search_box.setText("tiny")
    started = time.monotonic()
    window.search_button.click()
    qtbot.waitUntil(lambda: window.repos.count() == 1, timeout=10_000)
    qtbot.waitUntil(lambda: all(c and c != CHECKING for c in verdict_cells(window)), timeout=20_000)
    took = time.monotonic() - started
    timer.stop()
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    # Six header reads of 0.4 s each: on the GUI thread they would stop it for 0.4 s at least.
    assert took > HEADER_WAIT_S
    assert max(gaps) < 0.25, f"the event loop stopped for {max(gaps):.2f} s"
    assert window.repos.item(0).text() == f"{REPO}\n↓ 1.2M · ♥ 890 · updated 2026-11-01\napache-2.0"
    assert "1.2M downloads · 890 likes · updated 2026-11-01 · licence: apache-2.0" in (
        window.files.meta.text()
    )
    table = window.files.table
    assert sorted(table.item(r, 1).text() for r in range(table.rowCount())) == sorted(QUANTS)
    assert all(cell.startswith("✓ fits · 512 tok · ") for cell in verdict_cells(window))
    assert table.horizontalHeaderItem(VERDICT).text() == "On this machine (cpu)"
    table.selectRow(0)
    assert "one sequence can hold 512 tokens" in window.files.details.text()


def test_verdicts_are_read_only_for_the_rows_in_view(
    get_model_window, fake_hub: FakeHub, tiny_gguf: bytes, qtbot
) -> None:
    fake_hub.add_repo(REPO, {f"Tiny-{n:02d}-Q4_K_M.gguf": tiny_gguf for n in range(40)})
    window = get_model_window
    window.search_box.setText("tiny")
    window.search()
    table = window.files.table
    qtbot.waitUntil(lambda: table.rowCount() == 40, timeout=10_000)
    in_view = table.visible_rows()
    assert 3 < len(in_view) < 40
    qtbot.waitUntil(lambda: all(verdict_cells(window)[r] not in ("", CHECKING) for r in in_view))
    qtbot.wait(200)  # nothing more is asked for
    assert len(judged_files(fake_hub)) == len(in_view)
    assert all(verdict_cells(window)[r] == "" for r in range(40) if r not in in_view)
    table.scrollToBottom()
    qtbot.waitUntil(lambda: verdict_cells(window)[39].startswith("✓ fits"), timeout=10_000)
    assert len(judged_files(fake_hub)) < 40


def test_a_split_gguf_is_one_row_judged_from_all_its_parts(
    get_model_window, fake_hub: FakeHub, tiny_gguf: bytes, tmp_path: Path, qtbot
) -> None:
    source = tmp_path / "Tiny-Q8_0.gguf"
    source.write_bytes(tiny_gguf)
    parts = write_split_gguf(source, tmp_path / "split", max_tensors=8)
    assert len(parts) > 1
    fake_hub.add_repo(REPO, {p.name: p.read_bytes() for p in parts})
    window = get_model_window
    window.search_box.setText("tiny")
    window.search()
    table = window.files.table
    qtbot.waitUntil(lambda: table.rowCount() == 1, timeout=10_000)
    assert table.item(0, 0).text() == f"{parts[0].name} (+{len(parts) - 1} parts)"
    qtbot.waitUntil(lambda: verdict_cells(window)[0] not in ("", CHECKING), timeout=10_000)
    # The engine loads a split model from its parts: judged as the whole model.
    assert verdict_cells(window)[0].startswith("✓ fits · 512 tok")
    assert judged_files(fake_hub) == {p.name for p in parts}


def test_a_search_that_cannot_reach_the_hub_says_why(get_model_window, monkeypatch, qtbot) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    window = get_model_window
    window.search_box.setText("qwen")
    window.search()
    qtbot.waitUntil(lambda: "failed" in window.status.text())
    assert window.status.text() == (
        "The search failed: offline: HF_HUB_OFFLINE is set, so the hub is not asked"
    )
    assert window.status.property("error") is True
