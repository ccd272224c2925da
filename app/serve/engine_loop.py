"""One thread owns the engine: it takes requests and aborts from a queue, steps, and hands each
request's outputs to that request's asyncio queue. The HTTP side never touches the engine: it
speaks to the EngineDriver, whose queue is drained between steps by whoever owns the engine
(`kvscope serve`'s EngineThread, or the desktop app's worker).

The engine is not thread-safe; funnelling every call through this thread is what lets many
connections share one continuous batch."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from kvscope.app.core.engine_turn import run_turn
from kvscope.engine import LLMEngine, RequestOutput, SamplingParams

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 300
IDLE_WAIT_S = 0.05  # how long an idle engine thread blocks on its queue before looking again

StepHook = Callable[[list[RequestOutput]], None]


class Accepted:
    """First item on a request's queue: the engine took it (its prompt fits)."""


class RequestStream:
    """What the engine thread says about one request, read on the event loop: Accepted, then
    RequestOutputs (cumulative) until one is finished; or an exception instead."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self._loop = loop
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self.finished = False

    def put(self, item: Any) -> None:  # engine thread
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop closed under us (server shutting down)
            pass

    async def get(self) -> Any:
        item = await self._queue.get()
        if isinstance(item, RequestOutput) and item.finished:
            self.finished = True
        return item


@dataclass
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    stream: RequestStream
    # A text prompt's tokens, computed off this thread: a long prompt tokenized here would
    # stall every running stream for as long as it takes.
    prompt_token_ids: list[int] | None = None


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Call:
    fn: Callable[[LLMEngine], Any]
    future: Future


class EngineDriver:
    """The HTTP side's handle on the engine: commands go into a queue that whoever steps the
    engine drains between steps (`drain`), and each step's outputs come back (`deliver`).
    EngineThread below steps it in a thread of its own; the app's worker steps a shared engine
    with the driver among its sources of work (app/core/engine_turn.py)."""

    def __init__(self, engine: LLMEngine, wake: Callable[[], None] | None = None) -> None:
        self.engine = engine
        self.step_hooks: list[StepHook] = []  # run in the engine thread after every step
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[str, RequestStream] = {}
        self._wake = wake or (lambda: None)  # tell the stepping loop there is work

    # ---- any thread ----------------------------------------------------------------------
    def submit(
        self,
        request_id: str,
        prompt,
        params: SamplingParams,
        stream: RequestStream,
        prompt_token_ids: list[int] | None = None,
    ):
        self._commands.put(_Add(request_id, prompt, params, stream, prompt_token_ids))
        self._wake()

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))
        self._wake()

    def call(self, fn: Callable[[LLMEngine], Any]) -> Future:
        """Run fn(engine) between steps, in the engine thread; its result as a Future."""
        future: Future = Future()
        self._commands.put(_Call(fn, future))
        self._wake()
        return future

    # ---- the engine thread ---------------------------------------------------------------
    def owns(self, request_id: str) -> bool:
        return request_id in self._streams

    def drain(self, timeout: float | None = None) -> None:
        """Apply the queued commands (waiting up to `timeout` for the first, None: no wait)."""
        try:
            if timeout is None:
                command = self._commands.get_nowait()
            else:
                command = self._commands.get(timeout=timeout)
        except queue.Empty:
            return
        finished: list[RequestOutput] = []
        while True:
            self._apply(command, finished)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
        self._run_hooks(finished)

    def _apply(self, command, finished: list[RequestOutput]) -> None:
        if isinstance(command, _Add):
            try:
                self.engine.add_request(
                    command.request_id,
                    command.prompt,
                    command.params,
                    prompt_token_ids=command.prompt_token_ids,
                )
            except ValueError as e:  # the prompt or its parameters: the client's 400
                command.stream.put(e)
                return
            self._streams[command.request_id] = command.stream
            command.stream.put(Accepted())
        elif isinstance(command, _Abort):
            if self._streams.pop(command.request_id, None) is None:
                return  # finished already (or never ours): nothing to abort
            output = self.engine.abort_request(command.request_id)
            if output is not None:
                finished.append(output)
        elif isinstance(command, _Call):
            try:
                command.future.set_result(command.fn(self.engine))
            except Exception as e:
                command.future.set_exception(e)

    def deliver(self, outputs: list[RequestOutput]) -> None:
        """After a step: each served request's output to its stream, then the hooks."""
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            stream.put(output)
            if output.finished:
                del self._streams[output.request_id]
        self._run_hooks(outputs)

    def _run_hooks(self, outputs: list[RequestOutput]) -> None:
        for hook in self.step_hooks:
            try:
                hook(outputs)
            except Exception:  # metrics or events must never stop generation
                log.exception("serve step hook failed")

    def fail_all(self, error: Exception, engine_failed: bool = False) -> None:
        """Abort every served request in flight and tell its client why; the hooks see their
        final outputs. `engine_failed`: a step raised, so the samples it cut short carry the
        error (metrics count them as vLLM's finish reason "error", not as client aborts)."""
        finished: list[RequestOutput] = []
        for request_id, stream in list(self._streams.items()):
            output = self.engine.abort_request(request_id)
            if output is not None:
                if engine_failed:
                    for sample in output.outputs:
                        if sample.finish_reason == "abort" and sample.error is None:
                            sample.error = f"{type(error).__name__}: {error}"
                finished.append(output)
            stream.put(error)
        self._streams.clear()
        self._run_hooks(finished)


class EngineThread:
    """`kvscope serve`'s engine thread: it owns the engine and runs the shared turn
    (app/core/engine_turn.py) over the driver's queue until stopped."""

    def __init__(self, driver: EngineDriver) -> None:
        self.driver = driver
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvscope-serve-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish the step in progress (a long prefill on a busy CPU can take a while), then
        fail what is still in flight."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=STOP_TIMEOUT_S)

    def _run(self) -> None:
        engine = self.driver.engine
        while not self._stop.is_set():
            if not engine.has_unfinished_requests():
                self.driver.drain(timeout=IDLE_WAIT_S)  # sleep until work comes
            turn = run_turn(engine, [self.driver])
            if turn.error is not None:  # an engine bug: its requests failed, serving goes on
                log.error("engine step failed", exc_info=turn.error)
        self.driver.fail_all(RuntimeError("the server is shutting down"))
