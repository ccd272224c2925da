"""Issue 29: a replay plays: Play / Pause at a chosen speed, stepping on a timer."""

from __future__ import annotations

from recordings import TIMEOUT_MS, record_one_reply


def test_a_replay_plays_pauses_and_stops_at_the_end(make_window, qtbot, tmp_path, monkeypatch):
    from kvscope.app.desktop.recording.replay_view import PAUSE_TEXT, PLAY_TEXT

    monkeypatch.setenv("KVSCOPE_DATA_DIR", str(tmp_path / "data"))
    window = make_window(max_tokens=8, kv_budget_mib=8)
    controls = window.recording
    path = record_one_reply(window, qtbot)

    dialog = controls.open_recording(path)
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.loader.done, timeout=TIMEOUT_MS)
    dialog.poll()
    last = dialog.num_steps() - 1
    assert last >= 4 and dialog.play.isEnabled() and dialog.play.text() == PLAY_TEXT

    dialog.speed.setCurrentIndex(dialog.speed.findData(25))
    assert dialog._player.interval() == 40
    dialog.play.click()
    assert dialog.playing and dialog.play.text() == PAUSE_TEXT
    qtbot.waitUntil(lambda: dialog.slider.value() >= 2, timeout=10_000)
    dialog.play.click()  # pause: it stays where it is
    paused_at = dialog.slider.value()
    assert not dialog.playing and dialog.play.text() == PLAY_TEXT
    qtbot.wait(200)
    assert dialog.slider.value() == paused_at
    dialog.play.click()  # on to the end, where it pauses by itself
    qtbot.waitUntil(lambda: not dialog.playing, timeout=10_000)
    assert dialog.slider.value() == last
    assert dialog.paged_map.snapshot is dialog.loader.steps[last][0]
    dialog.play.click()  # at the end, Play starts over
    assert dialog.playing and dialog.slider.value() <= 1
    dialog.pause()
