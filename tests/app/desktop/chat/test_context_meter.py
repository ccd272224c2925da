"""The context meter: tokens the chat would take if sent now, counted on the engine's thread."""

import threading

from kvscope.app.core.context_fit import prompt_ids
from kvscope.app.core.engine_messages import ContextUsage
from kvscope.app.desktop.chat.context_meter import ContextMeter, usage_level

TIMEOUT_MS = 120_000


def test_the_meter_reads_used_of_limit_and_warns_near_and_over(qtbot):
    meter = ContextMeter()
    qtbot.addWidget(meter)
    meter.show_usage(ContextUsage(ticket=1, used=1234, limit=2048, reserve=256))
    assert meter.text() == "1,234 / 2,048 tokens" and meter.property("level") == "ok"
    assert meter.styleSheet() == ""
    assert usage_level(ContextUsage(1, 1500, 2048, 256)) == "near"  # 1,756 > 80 %
    meter.show_usage(ContextUsage(ticket=2, used=1900, limit=2048, reserve=256))
    assert meter.property("level") == "over" and "color" in meter.styleSheet()
    assert "does not fit" in meter.toolTip()


def test_the_count_is_the_engines_own_and_never_made_on_the_gui_thread(
    make_window, qtbot, monkeypatch
):
    import kvscope.app.desktop.engine_thread.worker as engine_worker

    window = make_window(max_model_len=64, max_tokens=6)
    meter = window.chat.context_meter
    counted_on = []

    def recording_prompt_ids(engine, system_prompt, turns):
        counted_on.append(threading.get_ident())
        return prompt_ids(engine, system_prompt, turns)

    monkeypatch.setattr(engine_worker, "prompt_ids", recording_prompt_ids)
    asked = []
    real_count = window.client.count_tokens
    window.client.count_tokens = lambda *args: (asked.append(args), real_count(*args))

    window.chats.new_conversation()
    window.chat.system_prompt.setPlainText("Be brief.")
    qtbot.waitUntil(lambda: meter.text().endswith("/ 64 tokens"), timeout=TIMEOUT_MS)
    asked.clear()
    qtbot.keyClicks(window.chat.composer, "hello there")  # eleven keys, one count
    qtbot.waitUntil(lambda: len(asked) == 1, timeout=TIMEOUT_MS)
    engine = window.client.worker.llm.engine  # idle: reading its tokenizer here is safe
    turns = [{"role": "user", "content": "hello there"}]
    expected = len(prompt_ids(engine, "Be brief.", turns))
    qtbot.waitUntil(lambda: meter.text() == f"{expected} / 64 tokens", timeout=TIMEOUT_MS)
    assert meter.property("level") == "ok"
    assert len(asked) == 1 and asked[0][1:] == ("Be brief.", turns, 6)
    assert counted_on and threading.main_thread().ident not in counted_on

    window.chat.composer.setPlainText("Tell me everything about the history of tea. " * 8)
    qtbot.waitUntil(lambda: meter.property("level") == "over", timeout=TIMEOUT_MS)
    used = int(meter.text().split(" / ")[0].replace(",", ""))
    assert used > 64 - 6


def test_an_edit_counts_the_turns_before_the_edited_message(make_window, qtbot):
    window = make_window(max_tokens=4)
    cid = window.chats.new_conversation()
    window.store.add_message(cid, "user", "First question, quite a long one about rivers.")
    window.store.add_message(cid, "assistant", "An answer.")
    window.chats.open_conversation(cid)
    meter = window.chat.context_meter
    engine = window.client.worker.llm.engine
    history = [{"role": m.role, "content": m.content} for m in window.store.messages(cid)]
    whole = len(prompt_ids(engine, "", history))
    qtbot.waitUntil(lambda: meter.text().startswith(f"{whole:,} /"), timeout=TIMEOUT_MS)
    window.chat.bubbles()[0].edit.click()
    window.chat.composer.setPlainText("Short.")
    alone = len(prompt_ids(engine, "", [{"role": "user", "content": "Short."}]))
    qtbot.waitUntil(lambda: meter.text().startswith(f"{alone:,} /"), timeout=TIMEOUT_MS)
