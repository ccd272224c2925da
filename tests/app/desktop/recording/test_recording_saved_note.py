"""Issue 29: the window says where a recording was saved (the file on a status-bar button,
its path in the tooltip) and shows it in its folder on a click."""

from __future__ import annotations

from pathlib import Path

from recordings import TIMEOUT_MS, record_one_reply


def test_a_saved_recording_says_where_and_shows_its_folder(
    make_window, qtbot, tmp_path, monkeypatch
):
    from kvscope.app.desktop.recording import controls as recording_controls

    monkeypatch.setenv("KVSCOPE_DATA_DIR", str(tmp_path / "data"))
    window = make_window(max_tokens=4, kv_budget_mib=8)
    controls = window.recording
    assert not controls.saved_button.isVisible()
    path = record_one_reply(window, qtbot)

    saved = controls.saved_button
    full = saved.full_text()
    assert saved.isVisible() and Path(path).name in full and "Show in folder" in full
    assert path in saved.toolTip()
    # Shortened, never widening the window: it still fits a 1024-px screen (it held it at 1,157).
    assert window.minimumSizeHint().width() <= 1024, window.minimumSizeHint()

    def narrow() -> bool:  # asked again: a busy machine may relayout after the first resize
        window.resize(1024, 700)
        return window.width() == 1024

    qtbot.waitUntil(narrow, timeout=5_000)
    assert saved.text() == "Saved · Show in folder"  # the short form; the name in the tooltip
    opened = []
    monkeypatch.setattr(  # the file manager itself is the desktop's: record what it is asked
        recording_controls.QDesktopServices, "openUrl", lambda url: opened.append(url) or True
    )
    saved.click()
    assert [u.toLocalFile() for u in opened] == [str(Path(path).parent)]
    menus = [a.menu() for a in window.menuBar().actions() if a.menu() is not None]
    assert any(controls.folder_action in menu.actions() for menu in menus)
    controls.folder_action.trigger()
    assert opened[-1].toLocalFile() == str(tmp_path / "data" / "recordings")

    # While recording, the action names the file; a new recording hides the old note.
    controls.record_action.trigger()
    qtbot.waitUntil(lambda: bool(controls.recording_path), timeout=TIMEOUT_MS)
    assert not saved.isVisible()
    assert controls.recording_path in controls.record_action.toolTip()
    controls.record_action.trigger()
    qtbot.waitUntil(lambda: not controls.recording_path, timeout=TIMEOUT_MS)
    assert saved.isVisible() and Path(controls.last_recording).name in saved.full_text()
