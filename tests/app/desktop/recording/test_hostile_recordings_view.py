"""Engine ▸ Open recording… on hostile files: the error shows in a dialog, the window runs on."""

from __future__ import annotations

import json

from kvscope.app.desktop.recording import replay_view
from kvscope.engine.kv.events import FORMAT_VERSION

TIMEOUT_MS = 120_000
HEADER = {
    "kvscope_events": FORMAT_VERSION,
    "num_blocks": 8,
    "block_size": 4,
    "allocator": "paged",
    "max_seq_len": 32,
    "model": "m",
}
ADD = {"kind": "sequence_added", "step": 1, "time": 1.0, "seq_id": 0, "request_id": "r"}
ADD |= {"sample": 0, "num_prompt_tokens": 4}
ALLOC = {"kind": "blocks_allocated", "step": 1, "time": 1.0, "seq_id": 0, "blocks": [1]}
ALLOC |= {"start": 0, "group": 0}
FREE = {"kind": "blocks_freed", "step": 2, "time": 2.0, "seq_id": 0, "blocks": [1]}
STEP = {"kind": "step_progress", "step": 1, "time": 1.0, "lens": [[0, 4, 4]]}


def test_hostile_recordings_show_their_error_and_the_window_runs_on(make_window, qtbot, tmp_path):
    window = make_window()
    shown = []
    window.error_shown.connect(shown.append)
    # A header nested 100k deep was a RecursionError out of the open action.
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    assert window.recording.open_recording(deep) is None
    assert "not a KVScope recording" in shown[-1]

    # A freed-twice block: the steps before it stay, the error names the event and the line.
    twice = tmp_path / "twice.jsonl"
    lines = [HEADER, ADD, ALLOC, STEP, FREE, {**STEP, "step": 2}, FREE]
    twice.write_text("\n".join(map(json.dumps, lines)) + "\n")
    dialog = window.recording.open_recording(twice)
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.error_box is not None, timeout=TIMEOUT_MS)
    assert dialog.num_steps() == 2
    text = dialog.error_box.text()
    assert "twice.jsonl:7: event 6 (blocks_freed) does not follow" in text, text
    assert "freed twice" in text

    # A header whose values are no plain values (a model name nested 900 deep) still opens.
    odd = tmp_path / "odd.jsonl"
    nested = "[" * 900 + "]" * 900
    odd.write_text(json.dumps(HEADER).replace('"m"', nested) + "\n" + json.dumps(STEP) + "\n")
    dialog = window.recording.open_recording(odd)
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.loader.done, timeout=TIMEOUT_MS)
    assert "unknown model" in dialog.about.text() and not dialog.loader.error

    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS):
        window.chats.send_message("Still there?")


def test_about_line_shows_only_plain_header_values(tmp_path):
    header = {**HEADER, "model": {"a": [1] * 10**5}, "num_blocks": 10**40, "allocator": True}
    about = replay_view._about(tmp_path / "x.jsonl", header)
    assert "unknown model · ? allocator · ? blocks × 4 slots" in about and len(about) < 300
