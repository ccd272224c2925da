"""ChatReplies: the chats' requests on the engine, one of the worker's sources of work.

It keeps each reply's request id with how many old turns its prompt dropped to fit the context,
and turns the engine's outputs for them into ReplyUpdates. A reply the engine failed alone
(every sample carries an error) fails with the engine's reason; a step that raised fails them
all. It runs on the worker's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kvscope.app.core.engine_messages import ReplyUpdate

if TYPE_CHECKING:
    from kvscope.engine import LLMEngine


class ChatReplies:
    def __init__(
        self,
        engine: Callable[[], LLMEngine | None],
        on_update: Callable[[ReplyUpdate], None],
        on_failed: Callable[[str, str], None],
    ) -> None:
        """`engine()`: the engine now (None: none is built); `on_update(update)` and
        `on_failed(request_id, message)` hear every reply's news."""
        self._engine = engine
        self._on_update, self._on_failed = on_update, on_failed
        self._dropped: dict[str, int] = {}  # request id -> old turns its prompt left out

    def __bool__(self) -> bool:
        return bool(self._dropped)

    def add(self, request_id: str, dropped: int) -> None:
        """A reply the engine has taken."""
        self._dropped[request_id] = dropped

    def stop(self, request_id: str) -> bool:
        """Abort a reply in flight; its last output goes out as its final update. False when it
        had finished already (its final output is on its way)."""
        engine = self._engine()
        if engine is None or request_id not in self._dropped:
            return False
        output = engine.abort_request(request_id)
        dropped = self._dropped.pop(request_id)
        if output is not None:
            self._on_update(ReplyUpdate.from_output(output, dropped))
        return True

    def stop_all(self) -> None:
        for request_id in list(self._dropped):
            self.stop(request_id)

    # ---- a source of work (app/core/engine_turn.py) --------------------------------------
    def drain(self) -> None:
        """Replies are added by the worker's slot as they come: nothing queued here."""

    def deliver(self, outputs) -> None:
        for output in outputs:
            dropped = self._dropped.get(output.request_id)
            if dropped is None:
                continue  # another source's
            errors = [c.error for c in output.outputs if c.error]
            if output.finished and errors and all(c.error for c in output.outputs):
                # The engine failed this reply alone (the others go on): say why.
                del self._dropped[output.request_id]
                self._on_failed(output.request_id, f"the engine failed this reply: {errors[0]}")
                continue
            if output.finished:
                del self._dropped[output.request_id]
            self._on_update(ReplyUpdate.from_output(output, dropped))

    def fail_all(self, error: Exception, engine_failed: bool = False) -> None:
        engine = self._engine()
        for request_id in list(self._dropped):
            if engine is not None:
                engine.abort_request(request_id)
            del self._dropped[request_id]
            self._on_failed(request_id, f"stopped by an engine error: {error}")
