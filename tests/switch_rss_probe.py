"""Switch the app's engine between models and print the process's RSS after each (Linux).

Run as its own process (tests/app/desktop/test_model_switch_memory.py does) so the figures are this
process's alone: `python tests/switch_rss_probe.py MODEL [MODEL ...]`, where a model is a
GGUF path or `bundled`. The engine lives where the app puts it: an EngineWorker on its QThread
behind an EngineClient, the first model built at start, each next one by apply_settings (what
the settings dialog's Apply and the model picker send). After each build one short chat reply
runs, so decode buffers and the fused CPU path are in use, and one JSON line is printed:
{"model": ..., "rss_mib": ..., "layout": the weights' layout, as the status bar shows it}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QCoreApplication, QEventLoop, QTimer  # noqa: E402

from kvscope.app.core.settings import EngineSettings  # noqa: E402
from kvscope.app.desktop.engine_thread.client import EngineClient  # noqa: E402

STEP_TIMEOUT_MS = 120_000  # one build and reply; far more than they take, to report a hang


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class Switcher:
    """Waits, in a local event loop on the GUI thread, for the worker's answers."""

    def __init__(self, settings: EngineSettings) -> None:
        self.client = EngineClient(settings)
        self.events: list[tuple[str, object]] = []
        self.client.engine_ready.connect(lambda info: self._got("ready", info))
        self.client.engine_failed.connect(lambda message: self._got("failed", message))
        self.client.request_output.connect(self._reply)
        self.client.request_failed.connect(lambda rid, message: self._got("failed", message))
        self._loop = QEventLoop()

    def _got(self, kind: str, value: object) -> None:
        self.events.append((kind, value))
        self._loop.quit()

    def _reply(self, update) -> None:
        if update.finished:
            self._got("reply", update)

    def wait_for(self, kind: str) -> object:
        timer = QTimer(singleShot=True, interval=STEP_TIMEOUT_MS)
        timer.timeout.connect(lambda: self._got("timeout", kind))
        timer.start()
        while not self.events:
            self._loop.exec()
        timer.stop()
        got, value = self.events.pop(0)
        if got != kind:
            raise RuntimeError(f"waited for {kind}, got {got}: {value}")
        return value

    def reply(self, request_id: str) -> None:
        params = {"max_tokens": 8, "temperature": 0.0}
        turns = [{"role": "user", "content": "hi, say something"}]
        self.client.submit(request_id, "", turns, params, "stop")
        self.wait_for("reply")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="GGUF paths, or 'bundled'")
    parser.add_argument("--kv-mib", type=int, default=64, help="the KV pool (MiB)")
    args = parser.parse_args(argv)

    def settings(model: str) -> EngineSettings:
        path = None if model == "bundled" else model
        return EngineSettings(model=path, kv_budget_mib=args.kv_mib, max_model_len=1024)

    app = QCoreApplication([])
    switcher = Switcher(settings(args.models[0]))
    switcher.client.start()
    for i, model in enumerate(args.models):
        if i:
            switcher.client.apply_settings(settings(model))
        info = switcher.wait_for("ready")
        switcher.reply(f"conv-1/r{i}")
        figures = {"model": model, "rss_mib": round(rss_mib(), 1), "layout": info.weight_layout}
        print(json.dumps(figures), flush=True)
    switcher.client.shutdown()
    app.processEvents()


if __name__ == "__main__":
    main(sys.argv[1:])
