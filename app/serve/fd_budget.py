"""How many connections the server may hold before the process runs out of file descriptors.

Every accepted socket is a descriptor. Past RLIMIT_NOFILE accept() fails with EMFILE, and so
does everything else that opens one: the engine reading a model, ZMQ, the app's chat database.
So the connection cap is sized from that limit (raised toward the hard limit first, where
allowed), minus what the process holds already and a reserve for what it opens later."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

try:
    import resource
except ImportError:  # Windows: no RLIMIT_NOFILE; the cap falls back to a fixed figure
    resource = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

FD_TARGET = 65536  # raise the soft limit up to here: far past the cap's ceiling, never unlimited
MAX_CONNECTIONS_CEILING = 4096  # one engine steps a few hundred sequences at most: plenty
NO_RLIMIT_CONNECTIONS = 1024  # where the limit cannot be read (Windows)
FD_RESERVE = 128  # opened after start: ZMQ sockets (several each), model and chat files, logs
MIN_CONNECTIONS = 4  # below this the server is of no use; a tiny limit still gets these


@dataclass(frozen=True)
class ConnectionBudget:
    """`cap` connections are served; `overflow` more are accepted only to be answered 503;
    past both a connection is closed at once. `backlog` is the listen backlog, which is also
    how many accept() asyncio runs in one pass: descriptors taken before any check can run."""

    cap: int
    overflow: int
    backlog: int
    fd_limit: int | None  # RLIMIT_NOFILE's soft limit it was sized from; None: unknown

    def describe(self) -> str:
        limit = "unknown" if self.fd_limit is None else str(self.fd_limit)
        return (
            f"{self.cap} connections (+{self.overflow} answered 503) "
            f"of {limit} file descriptors, backlog {self.backlog}"
        )


def raise_fd_limit(target: int = FD_TARGET) -> int | None:
    """Raise RLIMIT_NOFILE's soft limit toward min(hard, target); returns the soft limit now."""
    if resource is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(hard, target)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as e:  # macOS refuses past OPEN_MAX; a sandbox may refuse
            log.info("could not raise the open-file limit from %d to %d: %s", soft, want, e)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def open_fd_count() -> int | None:
    """Descriptors this process holds now (Linux, macOS); None where that cannot be read."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return max(0, len(os.listdir(folder)) - 1)  # less the one listdir itself opened
        except OSError:
            continue
    return None


def connection_budget(
    fd_limit: int | None, in_use: int | None, ceiling: int = MAX_CONNECTIONS_CEILING
) -> ConnectionBudget:
    """Split the descriptors left (limit - in use - reserve) into the cap, the 503 overflow and
    twice the backlog (a pass of accepts can land before the previous pass's are counted)."""
    if fd_limit is None:
        cap = min(ceiling, NO_RLIMIT_CONNECTIONS)
        return ConnectionBudget(cap, max(2, cap // 16), 256, None)
    reserve = min(FD_RESERVE, fd_limit // 8)
    free = fd_limit - (in_use if in_use is not None else 64) - reserve
    backlog = max(8, min(256, free // 8))
    overflow = max(2, min(64, free // 16))
    cap = max(MIN_CONNECTIONS, min(ceiling, free - 2 * backlog - overflow))
    return ConnectionBudget(cap, overflow, backlog, fd_limit)


def budget_for_this_process(ceiling: int = MAX_CONNECTIONS_CEILING) -> ConnectionBudget:
    """Raise the limit where allowed, then size the budget from what is held now."""
    return connection_budget(raise_fd_limit(), open_fd_count(), ceiling)
