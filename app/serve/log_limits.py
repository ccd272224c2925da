"""Log lines a client can cause, rate-limited: one line per kind every 10 s, with a count.

A server out of file descriptors is the worst time to spend what is left on logging: asyncio's
accept loop (`BaseSelectorEventLoop._accept_connection`) logs a traceback for every failed
accept(), `backlog` times a pass, and schedules a retry for each, so one hostile client made
373,082 tracebacks (151 MB) in 25 s. The filter sits on the logger that writes each of them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

LOG_INTERVAL_S = 10.0  # one line per kind per 10 s: enough to see it is still going on

# The loggers and messages a client can trigger at will, each rate-limited at its source.
FLOODABLE = {
    "asyncio": ("socket.accept() out of system resource",),  # EMFILE / ENFILE on accept
    "uvicorn.error": ("Invalid HTTP request received.",),  # one per malformed request
    "kvscope.app.serve.connections": ("",),  # our own: cap reached, deadlines passed
}


class RateLimitFilter(logging.Filter):
    """Lets through the first record of each kind (its message template) per `interval_s`,
    counts the others, and says how many were dropped on the next one it lets through."""

    def __init__(
        self,
        prefixes: tuple[str, ...] = ("",),
        interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.prefixes = prefixes
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._kinds: dict[str, tuple[float, int]] = {}  # template -> (last let through, dropped)

    def filter(self, record: logging.LogRecord) -> bool:
        kind = str(record.msg)
        if not kind.startswith(self.prefixes):
            return True
        now = self.clock()
        with self._lock:
            last, dropped = self._kinds.get(kind, (None, 0))
            if last is not None and now - last < self.interval_s:
                self._kinds[kind] = (last, dropped + 1)
                return False
            self._kinds[kind] = (now, 0)
        if dropped and last is not None:  # it dropped some only after letting one through
            # No '%' in the note: safe to append whether or not the record has arguments.
            record.msg = (
                f"{record.msg} [{dropped} more like this in the last {now - last:.0f} s not logged]"
            )
        return True


def install_log_limits(interval_s: float = LOG_INTERVAL_S) -> None:
    """Put one RateLimitFilter on each floodable logger (again: no change)."""
    for name, prefixes in FLOODABLE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimitFilter) for f in logger.filters):
            logger.addFilter(RateLimitFilter(prefixes, interval_s))
