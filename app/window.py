"""A first window: chat prompts run on the engine in a worker thread, with pool usage shown.

The full app (conversations, block map, settings) grows from here; this keeps the contract that
the GUI thread never waits on an engine step.
"""

from __future__ import annotations

import json

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot
from PySide6.QtWidgets import (
    QApplication,
    QLabel,
    QLineEdit,
    QMainWindow,
    QPlainTextEdit,
    QProgressBar,
    QVBoxLayout,
    QWidget,
)

from app.paths import ASSETS_DIR


class EngineWorker(QObject):
    """Owns the LLM; lives in its own thread and reports through signals only."""

    ready = Signal(str)
    text = Signal(str, str)  # request id, cumulative text
    stats = Signal(dict)
    finished = Signal(str)
    failed = Signal(str)

    def __init__(self) -> None:
        super().__init__()
        self.llm = None
        self._counter = 0

    @Slot()
    def load(self) -> None:
        from engine import LLM

        try:
            self.llm = LLM()
        except (OSError, ValueError) as e:
            self.failed.emit(str(e))
            return
        self.ready.emit(self.llm.engine.model_source)
        self.stats.emit(self.llm.stats())

    @Slot(list)
    def run_chats(self, prompts: list) -> None:
        from engine import SamplingParams

        engine = self.llm.engine
        params = SamplingParams(max_tokens=48, temperature=0.0)
        for prompt in prompts:
            self._counter += 1
            messages = [{"role": "user", "content": prompt}]
            engine.add_request(
                f"chat-{self._counter}", engine.apply_chat_template(messages), params
            )
        while engine.has_unfinished_requests():
            for out in engine.step():
                self.text.emit(out.request_id, out.outputs[0].text)
                if out.finished:
                    self.finished.emit(out.request_id)
            self.stats.emit(self.llm.stats())


class MainWindow(QMainWindow):
    submit = Signal(list)
    # Re-emitted on the GUI thread, so plain callables connected to them run there too.
    model_ready = Signal()
    model_failed = Signal(str)
    all_replies_done = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.setWindowTitle("KVScope")
        self.resize(900, 600)
        self.status = QLabel("Loading the model…")
        self.pool = QProgressBar()
        self.pool.setFormat("KV pool: %v / %m blocks used")
        self.transcript = QPlainTextEdit(readOnly=True)
        self.prompt = QLineEdit(placeholderText="Ask something and press Enter")
        self.prompt.setEnabled(False)
        body = QWidget()
        layout = QVBoxLayout(body)
        for w in (self.status, self.pool, self.transcript, self.prompt):
            layout.addWidget(w)
        self.setCentralWidget(body)
        self.replies: dict[str, str] = {}
        self.open_requests = 0

        self.thread_ = QThread(self)
        self.worker = EngineWorker()
        self.worker.moveToThread(self.thread_)
        self.thread_.started.connect(self.worker.load)
        self.worker.ready.connect(self._on_ready)
        self.worker.failed.connect(self._on_failed)
        self.worker.text.connect(self._on_text)
        self.worker.stats.connect(self._on_stats)
        self.worker.finished.connect(self._on_finished)
        self.submit.connect(self.worker.run_chats)
        self.prompt.returnPressed.connect(self._send)
        self.thread_.start()

    def ask(self, prompts: list[str]) -> None:
        self.open_requests += len(prompts)
        for p in prompts:
            self.transcript.appendPlainText(f"you: {p}")
        self.submit.emit(prompts)

    def _send(self) -> None:
        text = self.prompt.text().strip()
        if text:
            self.prompt.clear()
            self.ask([text])

    def _on_ready(self, source: str) -> None:
        self.status.setText(f"Model: {source}")
        self.prompt.setEnabled(True)
        self.model_ready.emit()

    def _on_failed(self, message: str) -> None:
        self.status.setText(f"Model failed to load: {message}")
        self.model_failed.emit(message)

    def _on_text(self, request_id: str, text: str) -> None:
        self.replies[request_id] = text

    def _on_finished(self, request_id: str) -> None:
        self.open_requests -= 1
        self.transcript.appendPlainText(f"assistant ({request_id}): {self.replies[request_id]}\n")
        if self.open_requests == 0:
            self.all_replies_done.emit()

    def _on_stats(self, stats: dict) -> None:
        self.pool.setMaximum(stats["kv_blocks_total"])
        self.pool.setValue(stats["kv_blocks_used"])

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self.thread_.quit()
        self.thread_.wait(5000)
        super().closeEvent(event)


def _demo_prompts(n: int) -> list[str]:
    workload = json.loads((ASSETS_DIR / "chat_mixed.json").read_text())
    chats = workload["chat"]
    return [chats[i % len(chats)]["messages"][-1]["content"] for i in range(n)]


def run_window(demo: int | None = None, screenshot: str | None = None) -> int:
    app = QApplication.instance() or QApplication([])
    window = MainWindow()
    window.show()
    if demo:

        def start_demo() -> None:
            window.ask(_demo_prompts(demo))

        def finish_demo() -> None:
            if screenshot:
                window.grab().save(screenshot)
            window.close()
            app.quit()

        window.model_ready.connect(start_demo)
        window.model_failed.connect(lambda _msg: app.exit(1))
        # A short delay lets the last reply paint before the grab.
        window.all_replies_done.connect(lambda: QTimer.singleShot(100, finish_demo))
    return app.exec()
