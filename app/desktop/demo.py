"""`kvscope --demo N --screenshot PNG`: N concurrent chats, then a picture of the window.

The demo chats are ordinary conversations (stored in the chats DB like any other), sent at once
so the engine batches them. When the first reply finishes the block map is paused: it keeps the
last snapshot in which every demo chat still holds its blocks (once all have finished, their
blocks are free and the map would be nearly empty). When every reply is in, the window is
grabbed and the app exits.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from kvscope.app.core.paths import ASSETS_DIR
from kvscope.app.core.settings import AppSettings, SamplingSettings, load_settings
from kvscope.app.desktop.window import MainWindow

DEMO_SAMPLING = SamplingSettings(temperature=0.7, top_p=0.9, max_tokens=32, seed=7)


@dataclass
class _DemoState:
    started: bool = False
    done: int = 0
    first: int | None = None  # the first demo chat, opened for the screenshot
    paused_at: int = 0  # the step the map paused at; set before finish() can run
    rc: int = 1


def demo_prompts(n: int) -> list[str]:
    chats = json.loads((ASSETS_DIR / "chat_mixed.json").read_text())["chat"]
    return [chats[i % len(chats)]["messages"][-1]["content"] for i in range(n)]


def run_demo(app: QApplication, n: int, screenshot: str | None) -> int:
    try:
        engine = load_settings().engine
    except ValueError as e:
        print(f"warning: {e}; the demo uses default settings", file=sys.stderr)
        engine = AppSettings().engine
    settings = AppSettings(engine=engine, sampling=DEMO_SAMPLING)
    window = MainWindow(settings=settings, persist_settings=False)
    window.show()
    state = _DemoState()

    def start(_info) -> None:
        if state.started:
            return
        state.started = True
        for prompt in demo_prompts(n):
            cid = window.chats.new_conversation()
            state.first = state.first or cid
            window.chats.send_message(prompt, cid)

    def one_done(_cid: int, _detail: str) -> None:
        state.done += 1
        if state.done == 1:
            window.set_map_paused(True)
            step = window.last_telemetry.stats["num_steps"] if window.last_telemetry else 0
            state.paused_at = step
        if state.done == n:
            QTimer.singleShot(0, finish)

    def finish() -> None:
        # The map holds the last snapshot before the first chat finished.
        window.statusBar().showMessage(f"Demo done · map paused at step {state.paused_at}")
        window.chats.open_conversation(state.first)
        # Let layout and the map paint before the grab.
        QTimer.singleShot(300, grab)

    def grab() -> None:
        if screenshot:
            if window.grab().save(screenshot):
                state.rc = 0
            else:
                print(f"error: could not write {screenshot}", file=sys.stderr)
        else:
            state.rc = 0
        window.close()
        app.quit()

    def failed(message: str) -> None:
        if not state.started:
            print(f"error: the model could not be loaded: {message}", file=sys.stderr)
            window.close()
            app.exit(1)

    window.engine_ready.connect(start)
    window.engine_failed.connect(failed)
    window.chats.reply_finished.connect(one_done)
    window.chats.reply_failed.connect(one_done)
    app.exec()
    return state.rc
