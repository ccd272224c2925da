"""The server while its engine is being built: it listens at once and says what it is doing.

Loading a model and building the engine take seconds to minutes (a big GGUF, a busy machine), and
a silent port looks dead: clients and supervisors poll `/health` and give up, a user wonders.
`kvscope serve` binds first and serves this ASGI app; `/health` answers 503 with
`{"status": "starting", "stage": ..., "seconds": ...}`, every other route a 503 in OpenAI's error
shape with a Retry-After, until `ready(app)` hands every request to the real app. A load that
fails says why on `/health` (`"status": "failed"`) until the process exits.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from kvscope.app.serve.errors import error_body

RETRY_AFTER_S = 2


class StartingApp:
    """ASGI app that answers for a server still starting, then forwards to the real one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._began = time.monotonic()
        self._stage = "starting"
        self._failure: str | None = None
        self._app: Any = None

    @property
    def stage(self) -> str:
        with self._lock:
            return self._stage

    def set_stage(self, stage: str) -> None:
        """What the server is doing now, in a few words ("loading the model")."""
        with self._lock:
            self._stage = stage

    def ready(self, app: Any) -> None:
        """From now on every request goes to `app`."""
        with self._lock:
            self._app = app

    def fail(self, message: str) -> None:
        with self._lock:
            self._failure = message

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        with self._lock:
            app, stage, failure = self._app, self._stage, self._failure
        if app is not None:
            await app(scope, receive, send)
            return
        if scope["type"] != "http":
            return  # lifespan is off; websockets are not served
        seconds = round(time.monotonic() - self._began, 1)
        if scope["path"] == "/health":
            status = "failed" if failure else "starting"
            body: dict = {"status": status, "stage": failure or stage, "seconds": seconds}
        else:
            why = (
                f"failed to start: {failure}" if failure else f"is starting ({stage}, {seconds} s)"
            )
            body = error_body(503, f"the server {why}; retry shortly")
        payload = json.dumps(body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"retry-after", str(RETRY_AFTER_S).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
