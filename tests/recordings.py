"""Recording from the real window and hand-written session files: what the replay and recording
tests share."""

from __future__ import annotations

TIMEOUT_MS = 120_000


def record_one_reply(window, qtbot, text: str = "Say hi.") -> str:
    """Record, send one message, stop: the session file's path."""
    controls = window.recording
    controls.record_action.trigger()
    qtbot.waitUntil(lambda: bool(controls.recording_path), timeout=TIMEOUT_MS)
    assert controls.record_action.isChecked()
    assert controls.record_action.text() == replay_stop_text()
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS):
        window.chats.send_message(text)
    controls.record_action.trigger()
    qtbot.waitUntil(lambda: not controls.recording_path, timeout=TIMEOUT_MS)
    assert not controls.record_action.isChecked()
    return controls.last_recording


def replay_stop_text() -> str:
    from kvscope.app.desktop.recording.controls import STOP_TEXT

    return STOP_TEXT


def header(**overrides) -> dict:
    return {
        "kvscope_events": 2,
        "num_blocks": 8,
        "block_size": 4,
        "allocator": "paged",
        "max_seq_len": 32,
        "model": "m",
        **overrides,
    }


STEP = {"kind": "step_progress", "step": 1, "time": 1.0, "lens": []}
