"""What stands in front of every route: the API key and the request size bound (pure ASGI
middleware, so a refused request never reaches a handler and the server goes on serving)."""

from __future__ import annotations

import hmac
import json

from kvscope.app.serve.errors import error_body

MAX_BODY_BYTES = 4 << 20  # 4 MiB: far above any prompt max_model_len admits, far below harm
OPEN_PATHS = ("/health",)  # what a load balancer probes without a key


async def _send_error(send, status: int, message: str, extra_headers=()) -> None:
    body = json.dumps(error_body(status, message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send(
        {"type": "http.response.start", "status": status, "headers": headers + list(extra_headers)}
    )
    await send({"type": "http.response.body", "body": body})


class ApiKeyGuard:
    """With a key set, every path but /health needs `Authorization: Bearer <key>` (401 else)."""

    def __init__(self, app, api_key: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.expected is None or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(given, self.expected):
            message = "missing API key" if not given else "invalid API key"
            return await _send_error(
                send,
                401,
                f"{message}: send 'Authorization: Bearer <key>'",
                [(b"www-authenticate", b"Bearer")],
            )
        return await self.app(scope, receive, send)


class BodySizeGuard:
    """Refuse a body over `limit` bytes with 413, by Content-Length or as it streams in."""

    def __init__(self, app, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        too_big = f"request body over the limit of {self.limit} bytes"
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await _send_error(send, 413, too_big)
        seen, over, answered = 0, False, False

        async def bounded_receive():
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    over = True
                    raise _TooLarge()
            return message

        async def guarded_send(message):
            # The body parser turns the exception into its own 400; what a chunked body over
            # the limit gets is the 413 promised, whatever the app tries to answer.
            nonlocal answered
            if not over:
                return await send(message)
            if not answered:
                answered = True
                await _send_error(send, 413, too_big)

        try:
            return await self.app(scope, bounded_receive, guarded_send)
        except _TooLarge:
            if not answered:
                answered = True
                return await _send_error(send, 413, too_big)


class _TooLarge(Exception):
    pass
