"""A system-prompt edit made just before Send or Regenerate goes with that reply (issue 14.5).

The box saves 400 ms after typing stops; a reply started inside that delay used to read the old
prompt from the store and then redraw the box from it, blanking the edit.
"""

TIMEOUT_MS = 120_000


def _record_submits(window):
    submitted = []
    real_submit = window.client.submit
    window.client.submit = lambda *args: (submitted.append(args), real_submit(*args))
    return submitted


def test_an_edit_inside_the_save_delay_goes_with_send_and_regenerate(make_window, qtbot):
    window = make_window(max_tokens=3)
    cid = window.chats.new_conversation()
    submitted = _record_submits(window)
    window.chat.system_toggle.setChecked(True)

    window.chat.system_prompt.setPlainText("You answer in French.")
    assert window.store.conversation(cid).system_prompt == ""  # still waiting to be saved
    window.chat.composer.setPlainText("Hello!")
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS):
        window.chat.send.click()
    assert submitted[-1][1] == "You answer in French."
    assert window.chat.system_prompt.toPlainText() == "You answer in French."
    assert window.store.conversation(cid).system_prompt == "You answer in French."

    window.chat.system_prompt.setPlainText("You answer in German.")
    assert window.store.conversation(cid).system_prompt == "You answer in French."
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS):
        window.chat.bubbles()[-1].regenerate.click()
    assert [args[1] for args in submitted] == ["You answer in French.", "You answer in German."]
    assert window.chat.system_prompt.toPlainText() == "You answer in German."
    assert window.store.conversation(cid).system_prompt == "You answer in German."
