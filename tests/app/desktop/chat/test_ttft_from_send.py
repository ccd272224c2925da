"""A reply's TTFT counts from Send: a question asked while the engine is being rebuilt waits for
it, and the bubble says so instead of the engine's own arrival-to-first-token figure."""

import dataclasses
import time

TIMEOUT_MS = 120_000  # the CPU is shared


def test_a_question_sent_during_a_rebuild_counts_the_wait(make_window, qtbot):
    window = make_window()
    engine = dataclasses.replace(window.settings.engine, block_size=32)
    window.apply_settings(dataclasses.replace(window.settings, engine=engine))
    first_seen: list[float] = []
    window.chats.reply_updated.connect(lambda u: first_seen.append(time.time()))
    sent = time.time()
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS):
        cid = window.chats.send_message("What is the capital of France?")
    _, reply = window.store.messages(cid)
    waited, ttft = reply.metrics["waited_s"], reply.metrics["ttft_s"]
    assert waited > 0.05  # the rebuild ran first: the engine took the question after it
    # From Send: more than the wait, and no later than the GUI heard of the first token.
    assert waited < ttft <= first_seen[0] - sent + 0.05
    bubble = window.chat.bubbles()[1]
    if waited >= 0.5:
        assert f"waited {waited:.1f} s for the engine" in bubble.metrics.text()
    window.close()
