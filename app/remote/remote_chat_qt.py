"""RemoteChatClient: a chat model on a remote server, with the EngineClient surface the chat uses.

The ChatController drives the embedded engine through `EngineClient.submit / stop`, hears back
through `request_output(ReplyUpdate)` and `request_failed(request_id, message)`, and its context
meter asks `count_tokens(...)`, answered by `context_usage`. This client offers the same for one
model on one connection, so a chat runs on either without the controller knowing which.

Each reply streams in a thread of its own (plain blocking httpx, app/remote/openai_http.py); the
GUI thread only posts and receives signals. Updates go out at most every STREAM_EMIT_S (the
controller redraws every 80 ms anyway), and always when a sample ends. `stop(request_id)` ends
the reply at once for the chat (the text so far, finish "abort", as the engine's stop does) and
cuts the stream's connection (OpenAIHttp.abort), which makes vLLM and `kvscope serve` abort the
request and free its blocks, even mid-prefill.

Token counts: prompt and cached tokens come with the stream's last event (`include_usage`), so
they are unknown while a reply streams; the composer's count uses the server's POST /tokenize
when it has one (vLLM, `kvscope serve`) and says "unknown" when it does not.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from PySide6.QtCore import QObject, QTimer, Signal

from kvscope.app.core.context_fit import reply_reserve
from kvscope.app.core.engine_messages import ContextUsage, ReplyUpdate
from kvscope.app.remote.connection import Connection
from kvscope.app.remote.openai_http import ChatDelta, OpenAIHttp, RemoteError

STREAM_EMIT_S = 0.05
COUNT_TIMEOUT_S = 10.0
JOIN_ON_SHUTDOWN_S = 2.0
MAX_SAMPLES = 16  # the most `n` the app asks for; a delta for a higher index is dropped


@dataclass(frozen=True)
class RemoteReplyUpdate(ReplyUpdate):
    """A ReplyUpdate from a remote server: which server answered, and whether the prompt's
    token counts are known yet (they come with the stream's last event)."""

    served_by: str = ""  # "label · model"
    usage_known: bool = False

    def metrics(self) -> dict:
        metrics = super().metrics()
        if not self.usage_known:  # "prompt 0 tok" would be a wrong number, not an unknown one
            metrics.pop("prompt_tokens")
            metrics.pop("cached_tokens")
        metrics["served_by"] = self.served_by
        return metrics


class _Reply:
    """One reply's progress, written by its stream thread, read by stop() on the GUI thread."""

    def __init__(self, request_id: str, n: int, served_by: str) -> None:
        self.request_id = request_id
        self.served_by = served_by
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.texts = [""] * n
        self.reasons: list[str | None] = [None] * n
        self.pieces = [0] * n  # text deltas per sample: a token each from vLLM and our server
        self.prompt_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.submitted = time.monotonic()
        self.first: float | None = None
        self.last: float | None = None
        self.http: OpenAIHttp | None = None  # set by the stream thread; stop() aborts it

    def apply(self, delta: ChatDelta) -> bool:
        """Take one delta; True when a sample just ended."""
        with self.lock:
            if delta.prompt_tokens is not None:
                self.prompt_tokens = delta.prompt_tokens
                self.cached_tokens = delta.cached_tokens or 0
                self.completion_tokens = delta.completion_tokens
                return False
            i = delta.index
            if not 0 <= i < MAX_SAMPLES:  # a broken server's index: nothing to grow a list to
                return False
            if i >= len(self.texts):  # a server sending more samples than asked: keep them
                grow = i + 1 - len(self.texts)
                self.texts += [""] * grow
                self.reasons += [None] * grow
                self.pieces += [0] * grow
            if delta.text:
                now = time.monotonic()
                self.first = self.first or now
                self.last = now
                self.texts[i] += delta.text
                self.pieces[i] += 1
            if delta.finish_reason:
                self.reasons[i] = delta.finish_reason
                return True
            return False

    def update(self, finished: bool, abort: bool = False) -> RemoteReplyUpdate:
        with self.lock:
            reasons = list(self.reasons)
            if abort:
                reasons = [r or "abort" for r in reasons]
            elif finished:
                reasons = [r or "stop" for r in reasons]
            generated = self.completion_tokens
            if generated is None or abort:
                generated = sum(self.pieces)
            ttft = self.first - self.submitted if self.first is not None else None
            tps = None
            end = self.last if self.last is not None else None
            n = len(self.texts)
            if self.first is not None and end is not None and end > self.first and generated > n:
                tps = (generated - n) / (end - self.first)
            return RemoteReplyUpdate(
                request_id=self.request_id,
                texts=list(self.texts),
                finish_reasons=reasons,
                finished=finished,
                num_generated=generated,
                prompt_tokens=self.prompt_tokens or 0,
                cached_tokens=self.cached_tokens or 0,
                ttft_s=ttft,
                tokens_per_s=tps,
                sample_tokens=list(self.pieces),
                served_by=self.served_by,
                usage_known=self.prompt_tokens is not None,
            )


def chat_messages(system_prompt: str, turns: list[dict]) -> list[dict]:
    """The OpenAI messages for a chat: its system prompt (if any), then its turns."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
    return system + [{"role": t["role"], "content": t["content"]} for t in turns]


class RemoteChatClient(QObject):
    """One model on one connection. Lives on the GUI thread; its threads only emit signals."""

    request_output = Signal(object)  # RemoteReplyUpdate
    request_failed = Signal(str, str)  # request id, message
    context_usage = Signal(object)  # ContextUsage, the answer to count_tokens
    context_unknown = Signal(int, str)  # ticket, why the count is not known

    def __init__(self, connection: Connection, model: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.connection = connection
        self.model = model
        self.label = f"{connection.label} · {model}"
        self._replies: dict[str, _Reply] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._counter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvscope-count")
        self._tokenize_missing = ""  # why /tokenize cannot count here, once it failed so
        self._latest_count = 0  # the newest ticket: older ones still queued are skipped
        self._closed = False

    # ---- the EngineClient surface ----------------------------------------------------------
    def submit(
        self, request_id: str, system_prompt: str, turns: list[dict], params: dict, policy: str
    ) -> None:
        """Start streaming a reply. `policy` (the engine's overflow policy) does not apply: the
        server keeps its own context and refuses a prompt that does not fit, with a message."""
        del policy
        reply = _Reply(request_id, max(1, int(params.get("n", 1))), self.label)
        self._replies[request_id] = reply
        thread = threading.Thread(
            target=self._stream,
            args=(reply, chat_messages(system_prompt, turns), dict(params)),
            name=f"kvscope-remote-{request_id}",
            daemon=True,  # a server that never answers must not keep the app from quitting
        )
        self._threads[request_id] = thread
        thread.start()

    def stop(self, request_id: str) -> None:
        """End the reply now with what it has, and cut its stream (the server aborts it)."""
        reply = self._replies.pop(request_id, None)
        if reply is None or reply.stopped.is_set():
            return  # finished already: its final update is on its way
        reply.stopped.set()
        if reply.http is not None:
            reply.http.abort()  # the server sees the client go now; the thread wakes
        update = reply.update(finished=True, abort=True)
        # Answered from the event loop, as the engine's worker answers: never inside the call.
        QTimer.singleShot(0, self, lambda: self.request_output.emit(update))

    def count_tokens(
        self, ticket: int, system_prompt: str, turns: list[dict], max_tokens: int
    ) -> None:
        """Count the prompt with the server's /tokenize; answered by context_usage, or by
        context_unknown when the server cannot say."""
        if self._tokenize_missing:
            self.context_unknown.emit(ticket, self._tokenize_missing)
            return
        messages = chat_messages(system_prompt, turns)
        self._latest_count = ticket
        self._counter.submit(self._count, ticket, messages, max_tokens)

    def shutdown(self) -> None:
        """Stop every reply and wait a little for the threads; the app may then quit."""
        self._closed = True
        for reply in list(self._replies.values()):
            reply.stopped.set()
            if reply.http is not None:
                reply.http.abort()
        deadline = time.monotonic() + JOIN_ON_SHUTDOWN_S
        for thread in list(self._threads.values()):
            thread.join(max(0.0, deadline - time.monotonic()))
        self._counter.shutdown(wait=False, cancel_futures=True)

    # ---- the threads -----------------------------------------------------------------------
    def _stream(self, reply: _Reply, messages: list[dict], params: dict) -> None:
        http = reply.http = OpenAIHttp(self.connection)
        if reply.stopped.is_set():  # stopped before this thread ran
            http.abort()
        stream = http.stream_chat(self.model, messages, params)
        last_emit = 0.0
        try:
            for delta in stream:
                if reply.stopped.is_set():
                    return  # stop() answered the chat already
                ended = reply.apply(delta)
                now = time.monotonic()
                if ended or now - last_emit >= STREAM_EMIT_S:
                    last_emit = now
                    self._emit(self.request_output, reply.update(finished=False))
        except RemoteError as e:
            if not reply.stopped.is_set():
                self._finish(reply.request_id)
                self._emit(self.request_failed, reply.request_id, str(e))
            return
        except Exception as e:  # anything else still ends the reply: never stuck "generating"
            if not reply.stopped.is_set():
                self._finish(reply.request_id)
                message = f"{self.label}: the reply failed: {type(e).__name__}: {e}"
                self._emit(self.request_failed, reply.request_id, message)
            return
        finally:
            stream.close()  # mid-stream: closes the connection, and the server aborts
            http.close()
            self._threads.pop(reply.request_id, None)
        if not reply.stopped.is_set():
            self._finish(reply.request_id)
            self._emit(self.request_output, reply.update(finished=True))

    def _finish(self, request_id: str) -> None:
        reply = self._replies.pop(request_id, None)
        if reply is not None:
            reply.stopped.set()  # a stop() that comes now finds it finished

    def _count(self, ticket: int, messages: list[dict], max_tokens: int) -> None:
        if self._closed or ticket != self._latest_count:  # a slow server: skip stale counts
            return
        try:
            with OpenAIHttp(self.connection, timeout=COUNT_TIMEOUT_S) as http:
                counted = http.count_tokens(self.model, messages=messages)
        except RemoteError as e:
            text = str(e)
            # A server without /tokenize (404 Not Found for the route, not for the model, or
            # 405): do not ask it again.
            if e.status == 405 or (e.status == 404 and self.model not in text):
                self._tokenize_missing = f"{self.connection.label} has no /tokenize to count with"
                text = self._tokenize_missing
            self._emit(self.context_unknown, ticket, text)
            return
        if counted.max_model_len is None:
            self._emit(
                self.context_unknown,
                ticket,
                f"{counted.count:,} tokens; {self.connection.label} did not say its context length",
            )
            return
        limit = counted.max_model_len
        usage = ContextUsage(ticket, counted.count, limit, reply_reserve(limit, max_tokens))
        self._emit(self.context_usage, usage)

    def _emit(self, signal, *args) -> None:
        try:
            signal.emit(*args)
        except RuntimeError:  # the client was deleted (the window closed): nobody listens
            pass
