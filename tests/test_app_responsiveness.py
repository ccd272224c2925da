"""The GUI thread keeps ticking while the engine works in its thread."""

import time

from PySide6.QtCore import QTimer

TIMEOUT_MS = 120_000
MAX_GAP_S = 0.100


def test_gui_thread_is_never_blocked_during_generation(make_window, qtbot):
    window = make_window(max_tokens=12)
    ticks = []
    timer = QTimer(interval=10)
    timer.timeout.connect(lambda: ticks.append(time.perf_counter()))
    finished = []
    window.reply_finished.connect(lambda cid, status: finished.append(status))
    telemetry = []
    window.telemetry_received.connect(lambda t: telemetry.append(t))
    timer.start()
    window.send_message("Tell me a story.", window.new_conversation())
    window.send_message("Tell me a joke.", window.new_conversation())
    start = time.perf_counter()
    qtbot.waitUntil(lambda: len(finished) == 2, timeout=TIMEOUT_MS)
    timer.stop()
    busy = [t for t in ticks if t >= start]
    gaps = [b - a for a, b in zip(busy, busy[1:], strict=False)]
    assert len(busy) > 20 and len(telemetry) > 2
    assert max(gaps) < MAX_GAP_S, f"the GUI thread stalled for {max(gaps) * 1000:.0f} ms"
