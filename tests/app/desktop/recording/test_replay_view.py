"""Record a session from the window and scrub through it on the maps; bad files only say why."""

from __future__ import annotations

import json

import pytest
from recordings import STEP, TIMEOUT_MS, header, record_one_reply  # noqa: F401

from kvscope.app.desktop.recording import replay_view
from kvscope.engine.kv.replay import replay_events


def test_a_recorded_reply_replays_step_by_step_on_the_maps(
    make_window, qtbot, tmp_path, monkeypatch
):
    monkeypatch.setenv("KVSCOPE_DATA_DIR", str(tmp_path / "data"))
    window = make_window(max_tokens=5, kv_budget_mib=8)
    menus = {action.text(): action.menu() for action in window.menuBar().actions()}
    assert set(window.recording.actions()) <= set(menus["&Engine"].actions())
    assert window.recording.button.defaultAction() is window.recording.record_action
    path = record_one_reply(window, qtbot)
    assert path.startswith(str(tmp_path / "data" / "recordings"))
    expected = list(replay_events(path, with_shadow=True))
    assert len(expected) >= 4  # a prefill step and a few decodes

    dialog = window.recording.open_recording(path)
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.loader.done, timeout=TIMEOUT_MS)
    dialog.poll()
    assert dialog.num_steps() == len(expected)
    assert not dialog.loader.error and not dialog.error.isVisible()
    assert "SmolLM2" in dialog.about.text() and "paged allocator" in dialog.about.text()
    for index in (len(expected) - 2, 0, 1):
        dialog.slider.setValue(index)
        pool, shadow = expected[index]
        assert dialog.paged_map.snapshot.equals(pool)
        assert dialog.shadow_map.snapshot.equals(shadow)
        assert f"Step {index + 1} of {len(expected)} " in dialog.step_label.text()
    dialog.next.click()
    assert dialog.paged_map.snapshot.equals(expected[2][0])
    busy = expected[1][0]
    assert busy.metrics.blocks_used > 0 and busy.metrics.num_running == 1
    dialog.slider.setValue(1)
    dialog.resize(1100, 620)
    dialog.grab().save(str(tmp_path / "replay.png"))


def test_recording_waits_for_an_idle_engine_and_says_so(make_window, qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("KVSCOPE_DATA_DIR", str(tmp_path / "data"))
    window = make_window(max_tokens=200)
    cid = window.chats.send_message("Count to one hundred.")
    with qtbot.waitSignal(window.error_shown, timeout=TIMEOUT_MS) as shown:
        window.recording.record_action.trigger()
    assert "idle" in shown.args[0]
    assert not window.recording.record_action.isChecked()
    assert window.recording.record_action.isEnabled()
    assert not window.recording.recording_path
    assert not list((tmp_path / "data" / "recordings").iterdir())
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS):
        window.chats.stop(cid)


FREED = {"kind": "blocks_freed", "step": 2, "time": 2.0, "seq_id": 7, "blocks": [3]}


def error_of(window, qtbot, path) -> tuple[str, str]:
    """(where the error showed: "window" or "dialog", its text) for opening `path`."""
    shown = []
    window.error_shown.connect(shown.append)
    dialog = window.recording.open_recording(path)
    if dialog is None:
        return "window", shown[-1]
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.error_box is not None, timeout=TIMEOUT_MS)
    assert dialog.num_steps() == 0 and dialog.error.isVisible()
    return "dialog", dialog.error_box.text()


@pytest.mark.parametrize(
    "content, where, problem",
    [
        (b"\xff\xfe not text at all", "window", "not a KVScope recording"),
        (b"", "window", "not a KVScope recording"),
        (json.dumps(header(num_blocks=1 << 40)).encode(), "window", "the viewer shows up to"),
        (b"[1, 2, 3]\n", "dialog", "bad header"),
        (json.dumps(header(kvscope_events=99)).encode(), "dialog", "version 99"),
        (json.dumps(header(num_blocks=-1)).encode(), "dialog", "header num_blocks -1"),
    ],
)
def test_a_file_that_is_no_recording_says_why_and_the_app_runs_on(
    make_window, qtbot, tmp_path, content, where, problem
):
    window = make_window()
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(content)
    shown_in, text = error_of(window, qtbot, path)
    assert (shown_in, problem in text) == (where, True), text
    assert error_of(window, qtbot, tmp_path / "missing.jsonl")[0] == "window"
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS):
        window.chats.send_message("Still there?")


def test_a_recording_damaged_midway_keeps_the_steps_before_the_damage(qtbot, tmp_path):
    path = tmp_path / "damaged.jsonl"
    lines = [header(), STEP, {**STEP, "step": 2}, FREED, {**STEP, "step": 3}]
    path.write_text("\n".join(json.dumps(line) for line in lines))
    dialog = replay_view.open_recording(path)
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.error_box is not None, timeout=TIMEOUT_MS)
    assert dialog.num_steps() == 2
    assert "after step 2" in dialog.error.text() and "blocks_freed" in dialog.error.text()
    assert "does not follow" in dialog.error_box.text()
    dialog.slider.setValue(1)
    assert dialog.paged_map.snapshot.step == 2


def test_a_long_or_huge_recording_is_capped(qtbot, tmp_path, monkeypatch):
    path = tmp_path / "long.jsonl"
    lines = [header()] + [{**STEP, "step": i} for i in range(1, 30)]
    path.write_text("\n".join(json.dumps(line) for line in lines))
    monkeypatch.setattr(replay_view, "MAX_STEPS", 5)
    dialog = replay_view.open_recording(path)
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.loader.done, timeout=TIMEOUT_MS)
    dialog.poll()
    assert dialog.num_steps() == 5 and "first 5 steps" in dialog.step_label.text()
    monkeypatch.setattr(replay_view, "MAX_FILE_BYTES", 100)
    with pytest.raises(ValueError, match="the viewer opens recordings up to"):
        replay_view.open_recording(path)
