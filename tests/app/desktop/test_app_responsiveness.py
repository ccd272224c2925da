"""The GUI thread never calls into the engine, and runs its events while a step runs.

Asserted on the event loop's work, never on time: which thread calls the engine, whether a
GUI-thread timer fires while a step is held open, and how many redraws each snapshot costs.
The longest gap between GUI ticks is printed as a figure (`gui_max_gap_ms`, shown by
`pytest -rP`), never asserted: a loaded machine stretches any gap.
"""

import inspect
import threading
import time

from PySide6.QtCore import QTimer

TIMEOUT_MS = 120_000
HOLD_LIMIT_S = 60.0  # how long a held step waits for the GUI thread before the test fails


def _record_calling_threads(obj, calls: list) -> None:
    """Wrap every public method of `obj` (on the instance) to note (name, calling thread)."""

    def recorded(name, method):
        def call(*args, **kwargs):
            calls.append((name, threading.get_ident()))
            return method(*args, **kwargs)

        return call

    for name, _function in inspect.getmembers(type(obj), inspect.isfunction):
        if not name.startswith("_"):
            setattr(obj, name, recorded(name, getattr(obj, name)))


def test_the_engine_runs_on_the_worker_thread_and_each_snapshot_is_drawn_once(make_window, qtbot):
    window = make_window(max_tokens=12)
    llm = window.client.worker.llm
    calls = []
    _record_calling_threads(llm, calls)
    _record_calling_threads(llm.engine, calls)
    redraws, stream_redraws, updates = [], [], []
    real_update_view = window.blockmap.update_view
    window.blockmap.update_view = lambda *a: (redraws.append(a), real_update_view(*a))
    real_update_pending = window.chat.update_pending
    window.chat.update_pending = lambda *a: (stream_redraws.append(a), real_update_pending(*a))
    window.chats.reply_updated.connect(updates.append)
    shown = []
    window.telemetry_received.connect(shown.append)
    ticks = []
    timer = QTimer(interval=10)
    timer.timeout.connect(lambda: ticks.append(time.perf_counter()))
    finished = []
    window.chats.reply_finished.connect(lambda cid, status: finished.append(status))

    timer.start()
    window.chats.send_message("Tell me a story.", window.chats.new_conversation())
    window.chats.send_message("Tell me a joke.", window.chats.new_conversation())
    qtbot.waitUntil(lambda: len(finished) == 2, timeout=TIMEOUT_MS)
    window.blockmap._info_provider(0)  # a hover's block query goes to the engine as well
    qtbot.waitUntil(lambda: window.last_telemetry.stats["num_running"] == 0, timeout=TIMEOUT_MS)
    qtbot.waitUntil(lambda: any(name == "block_contents" for name, _ in calls), timeout=TIMEOUT_MS)
    timer.stop()

    gui = threading.get_ident()
    called = {name for name, _ in calls}
    assert {"add_request", "step", "kv_snapshot", "stats", "block_contents"} <= called
    assert {thread for _, thread in calls if thread == gui} == set()
    assert len({thread for _, thread in calls}) == 1  # the one worker thread
    # Each telemetry (pool snapshots and stats) is drawn once at most, with one map draw.
    assert shown and len({id(t) for t in shown}) == len(shown) == len(redraws)
    streaming = [u for u in updates if not u.finished]
    assert len(stream_redraws) <= len(streaming)
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    print(f"gui_max_gap_ms {max(gaps, default=0.0) * 1000:.1f}")  # a figure: `pytest -rP`


def test_the_gui_thread_runs_its_events_while_a_step_is_held(make_window, qtbot):
    window = make_window(max_tokens=4)
    engine = window.client.worker.llm.engine
    step_running, gui_ran = threading.Event(), threading.Event()
    held = []  # for the first step: did the GUI thread run an event while it was held?
    real_step = engine.step

    def held_step():
        if not held:
            step_running.set()
            held.append(gui_ran.wait(HOLD_LIMIT_S))
        return real_step()

    engine.step = held_step
    timer = QTimer(interval=10)
    timer.timeout.connect(lambda: gui_ran.set() if step_running.is_set() else None)
    timer.start()
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS) as done:
        cid = window.chats.send_message("Name a colour.")
    timer.stop()
    assert held == [True], "the GUI thread ran no event while a step was in progress"
    assert done.args == [cid, "complete"]
