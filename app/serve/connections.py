"""Connection limits uvicorn lacks: deadlines for a request to arrive, and a cap that answers 503.

uvicorn (0.55, h11) times out only an idle keep-alive connection, and only until its first
byte: a socket that never sends, or sends part of a request line, or part of a body, holds its
file descriptor forever, and ~20,000 of them made every later accept() fail with EMFILE. Its
`limit_concurrency` answers 503 with a plain-text body and no Retry-After, and still holds every
socket it accepted. `GuardedH11Protocol` is uvicorn's h11 protocol with both bounds added:
- a request's head must arrive within `header_timeout_s` of the connection (or of its first
  byte after a keep-alive pause), its body within `body_timeout_s` of the head, else the
  connection is closed; a request being answered (a long generation) has no deadline;
- past `budget.cap` open connections a request gets a 503 with an OpenAI error body and
  Retry-After; past `budget.cap + budget.overflow` the connection is closed at once, so the
  descriptors the server holds stay inside the budget sized from RLIMIT_NOFILE;
- one remote address holding its share of the cap (`per_client_cap`) gets the same 503 for
  its next few connections, then they are closed at once, so one client re-opening sockets as
  they close cannot hold every slot."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from kvscope.app.serve.errors import error_body
from kvscope.app.serve.fd_budget import ConnectionBudget

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 10.0  # a request head is a few hundred bytes: 10 s is slow on any link
BODY_TIMEOUT_S = 30.0  # the largest body admitted (4 MiB) at ~140 KB/s
KEEP_ALIVE_S = 5  # idle between requests (uvicorn's default): reconnecting is cheap
OVERFLOW_HEADER_TIMEOUT_S = 2.0  # a connection over the cap only waits to be told 503
RETRY_AFTER_S = 1  # connections free up as fast as requests finish
# Below this many slots per address the default per-client cap is the whole cap (see below).
MIN_PER_CLIENT = 8
# Past its share an address gets this many 503s at a time, so its client reads why; its further
# connections are closed at once: its 503s would hold slots everyone else needs.
PER_CLIENT_503S = 8


@dataclass(frozen=True)
class ConnectionLimits:
    """The server's connection bounds; `max_connections` None: sized from RLIMIT_NOFILE."""

    max_connections: int | None = None
    # Open connections one remote address may hold; None: per_client_cap's default.
    max_connections_per_client: int | None = None
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    keep_alive_s: float = KEEP_ALIVE_S
    retry_after_s: int = RETRY_AFTER_S

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_connections_per_client"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be above 0 s, got {value}")


def per_client_cap(limits: ConnectionLimits, cap: int) -> int:
    """How many of the `cap` connections one remote address may hold. By default half: every
    client of a local server is 127.0.0.1, and half of 4,096 is far past what an editor, an
    agent and the app open together, while a hostile address leaves the other half to everyone
    else. A cap under 2 x MIN_PER_CLIENT (a hopeless descriptor limit) is not split at all:
    there serving one user at all matters more than sharing a handful of slots."""
    if limits.max_connections_per_client is not None:
        return min(cap, limits.max_connections_per_client)
    return min(cap, max(MIN_PER_CLIENT, cap // 2))


def overloaded_app(cap: int, retry_after_s: int, message: str | None = None):
    """The ASGI app a connection over the cap gets: 503, an OpenAI error body, Retry-After."""
    message = message or (
        f"the server holds its limit of {cap} open connections; retry in {retry_after_s} s"
    )
    body = json.dumps(error_body(503, message)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(retry_after_s).encode()),
        (b"connection", b"close"),
    ]

    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with request deadlines and the connection cap (see module)."""

    limits: ConnectionLimits = ConnectionLimits()
    budget: ConnectionBudget = ConnectionBudget(1024, 64, 256, None)
    # Open connections by remote address, this server's (guarded_protocol gives each its own);
    # touched only from the event loop.
    held_by_address: dict[str | None, int] = {}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: str | None = None  # what the deadline is for: "head", "body" or none
        self._header_timeout_s = self.limits.header_timeout_s
        self._address: str | None = None
        self._counted = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._address = self.client[0] if self.client else None
        held = self.held_by_address.get(self._address, 0)
        self.held_by_address[self._address] = held + 1
        self._counted = True
        open_now = len(self.connections)
        share = per_client_cap(self.limits, self.budget.cap)
        if open_now > self.budget.cap + self.budget.overflow:
            log.warning(
                "closed a connection at once: %d open, over the cap of %d and %d more answered 503",
                open_now,
                self.budget.cap,
                self.budget.overflow,
            )
            transport.close()
            return
        if held >= share + PER_CLIENT_503S:
            # Its 503s hold slots too (everyone's count): past a few, it is not answered at all.
            log.warning("closed a connection at once: %s holds %d", self._address, held)
            transport.close()
            return
        if open_now > self.budget.cap:
            log.warning(
                "answering 503: %d connections open, the cap is %d", open_now, self.budget.cap
            )
            self._answer_503()
        elif held >= share:
            log.warning("answering 503: %s holds %d connections, its cap", self._address, held)
            retry = self.limits.retry_after_s
            self._answer_503(
                f"your address holds {held} open connections, its limit of {share} (of the "
                f"server's {self.budget.cap}); retry in {retry} s"
            )
        self._track()

    def _answer_503(self, message: str | None = None) -> None:
        """This connection's request gets a 503 (and only a short wait for its head)."""
        self.app = overloaded_app(self.budget.cap, self.limits.retry_after_s, message)
        self._header_timeout_s = min(OVERFLOW_HEADER_TIMEOUT_S, self._header_timeout_s)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        if self._counted:
            self._counted = False
            left = self.held_by_address[self._address] - 1
            if left:
                self.held_by_address[self._address] = left
            else:  # no entry per address ever seen: the table stays as small as what is open
                del self.held_by_address[self._address]
        super().connection_lost(exc)

    def _current_phase(self) -> str | None:
        if self.transport is None or self.transport.is_closing():
            return None
        their = self.conn.their_state
        if their is h11.IDLE:
            # Between requests uvicorn's keep-alive timer runs, until the next request's first
            # byte cancels it: from then on the head has its deadline.
            return "idle" if self.timeout_keep_alive_task is not None else "head"
        if their is h11.SEND_BODY:
            return "body"
        return None  # the request is in: it is being answered, however long that takes

    def _track(self) -> None:
        phase = self._current_phase()
        if phase == self._phase:
            return  # a deadline runs from the start of its phase, not from the latest byte
        self._cancel_deadline()
        self._phase = phase
        if phase is None:
            return  # not waiting on the client for a request: nothing of ours to time
        timeout = {"head": self._header_timeout_s, "body": self.limits.body_timeout_s}.get(phase)
        if timeout is not None:
            self._deadline = self.loop.call_later(timeout, self._expired, phase, timeout)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, phase: str, timeout: float) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        log.info("closed a connection whose request %s did not arrive within %g s", phase, timeout)
        self.transport.close()  # connection_lost tells a handler waiting on the body


def guarded_protocol(limits: ConnectionLimits, budget: ConnectionBudget) -> type[H11Protocol]:
    """A GuardedH11Protocol class bound to these limits, for uvicorn.Config(http=...)."""
    return type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {"limits": limits, "budget": budget, "held_by_address": {}},
    )
