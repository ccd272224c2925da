"""Pause, resume and cancel for a pull, safe to call from any thread (the desktop's GUI thread)
while another thread downloads.

Pause and cancel also shut the socket being read, so a download blocked in a read (a stalled
server) stops at once instead of after the stall timeout.
"""

from __future__ import annotations

import socket
import threading


class PullControl:
    """The flags the downloading thread checks, and the socket it is reading."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._paused = False
        self._cancelled = False
        self._socket: socket.socket | None = None

    @property
    def paused(self) -> bool:
        with self._changed:
            return self._paused

    @property
    def cancelled(self) -> bool:
        with self._changed:
            return self._cancelled

    def pause(self) -> None:
        with self._changed:
            self._paused = True
            self._interrupt()
            self._changed.notify_all()

    def resume(self) -> None:
        with self._changed:
            self._paused = False
            self._changed.notify_all()

    def cancel(self) -> None:
        with self._changed:
            self._cancelled = True
            self._interrupt()
            self._changed.notify_all()

    def attach(self, sock: socket.socket | None) -> None:
        """The socket the downloading thread reads now (None once it is done with it)."""
        with self._changed:
            self._socket = sock
            if sock is not None and (self._paused or self._cancelled):
                self._interrupt()

    def wait_while_paused(self) -> None:
        """Block until resumed or cancelled."""
        with self._changed:
            self._changed.wait_for(lambda: not self._paused or self._cancelled)

    def sleep(self, seconds: float) -> None:
        """Wait `seconds` (a retry's backoff) unless paused or cancelled first."""
        with self._changed:
            self._changed.wait_for(lambda: self._paused or self._cancelled, timeout=seconds)

    def _interrupt(self) -> None:
        if self._socket is None:
            return
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed: the read it would have woken is over
