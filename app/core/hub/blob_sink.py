"""A download's partial file: appended to and hashed as the bytes arrive.

Three threads pass a few 1 MiB buffers along: the socket's thread reads into one, a writer
thread writes it to the file, a hasher thread hashes it, and the buffer goes back to be read
into again. sha256, the write and the socket read all release the GIL, so on two cores they
overlap and a download runs at its slowest stage rather than at their sum (on loopback, pull
at 0.97 of a plain read that hashes and writes in turn; with hashing and writing on one thread,
0.89). The flusher thread pushes the written bytes to the disk every `_FLUSH_EVERY`, so the
flush that makes a finished file durable is short and the disk's writeback runs beside the
download instead of after it. A resumed download first re-hashes the bytes it already has, so
the digest covers the whole file; the file's length is where it resumes, and it only ever holds
bytes in the order they arrived.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

_REHASH_BLOCK = 8 << 20
_BUFFER_BYTES = 1 << 20  # one read from the socket
_BUFFERS = 4  # buffers in turn between the socket's thread and the writer
_FLUSH_EVERY = 8 << 20  # bytes written between two flushes: small, so writeback keeps up


def new_hasher(algorithm: str, size: int) -> Any:
    """The hash the hub publishes: LFS sha256, or git's blob sha1 for files kept in git."""
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm == "git-sha1":
        hasher = hashlib.sha1(usedforsecurity=False)
        hasher.update(b"blob %d\0" % size)
        return hasher
    raise ValueError(f"unknown hash algorithm {algorithm!r}")


def write_all(fd: int, data: bytes | memoryview) -> None:
    """os.write until every byte is down (it may write fewer on some file systems)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _flush(fd: int) -> None:
    """Data to the disk (fdatasync where there is one: the file's times can wait)."""
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:
        os.fsync(fd)


class BlobSink:
    """A partial file being filled: `open` resumes it; `buffer` + `submit` append;
    `drain` waits for what was submitted; `hexdigest` ends it; `close` always."""

    def __init__(self, path: Path, algorithm: str, size: int) -> None:
        self.path = path
        self._algorithm = algorithm
        self._size = size
        self._hasher = new_hasher(algorithm, size)
        self._fd = -1
        self._unflushed = 0
        self._flush_wanted = threading.Event()
        self._closing = False
        self._flusher: threading.Thread | None = None
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        self._filled: queue.Queue[tuple[bytearray, int] | None] = queue.Queue()
        self._written: queue.Queue[tuple[bytearray, int] | None] = queue.Queue()
        self._writer: threading.Thread | None = None
        self._hashing: threading.Thread | None = None
        self._error: OSError | None = None  # the writer's first failure (ENOSPC), raised here

    def open(self, on_rehash: Callable[[int], None] | None = None) -> int:
        """Open (or create) the partial file, hash what it holds; returns where to resume."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o666)
        have = os.fstat(self._fd).st_size
        if have > self._size:
            have = 0  # longer than the file: not its bytes
        os.ftruncate(self._fd, have)
        done = 0
        with open(self._fd, "rb", closefd=False) as existing:
            while done < have:
                block = existing.read(min(_REHASH_BLOCK, have - done))
                self._hasher.update(block)
                done += len(block)
                if on_rehash is not None:
                    on_rehash(done)
        os.lseek(self._fd, have, os.SEEK_SET)
        for _ in range(_BUFFERS):
            self._free.put(bytearray(_BUFFER_BYTES))
        self._writer = threading.Thread(target=self._write_filled, name="pull-writer")
        self._writer.daemon = True
        self._writer.start()
        self._hashing = threading.Thread(target=self._hash_written, name="pull-hasher")
        self._hashing.daemon = True
        self._hashing.start()
        self._flusher = threading.Thread(target=self._flush_when_asked, name="pull-flusher")
        self._flusher.daemon = True
        self._flusher.start()
        return have

    def buffer(self) -> memoryview:
        """A free buffer to read the next bytes into (waits while the writer has them all)."""
        self._raise_writer_error()
        return memoryview(self._free.get())

    def submit(self, buffer: memoryview, count: int) -> None:
        """Hand the first `count` bytes of a `buffer()` to the writer; the buffer is its now."""
        self._raise_writer_error()
        self._filled.put((buffer.obj, count))  # type: ignore[arg-type]

    def release(self, buffer: memoryview) -> None:
        """Give back a `buffer()` that received nothing: the pool stays whole for the next
        read (a pause, a drop or a stall would otherwise cost one of its few buffers)."""
        self._free.put(buffer.obj)  # type: ignore[arg-type]

    def drain(self) -> None:
        """Wait until every submitted byte is written and hashed; a full disk raises
        OSError(ENOSPC) here (or from the next `buffer`/`submit`)."""
        self._filled.join()
        self._written.join()
        self._raise_writer_error()

    def restart(self) -> None:
        """Throw away what was written (the server ignored the Range): start from byte 0."""
        self.drain()
        os.ftruncate(self._fd, 0)
        os.lseek(self._fd, 0, os.SEEK_SET)
        self._hasher = new_hasher(self._algorithm, self._size)

    def hexdigest(self) -> str:
        """Digest of the whole file, once its bytes are on the disk."""
        self.drain()
        os.fsync(self._fd)
        return str(self._hasher.hexdigest())

    def close(self) -> None:
        if self._writer is not None:
            self._filled.put(None)
            self._writer.join()
            self._writer = None
        if self._hashing is not None:
            self._written.put(None)
            self._hashing.join()
            self._hashing = None
        if self._flusher is not None:
            self._closing = True
            self._flush_wanted.set()
            self._flusher.join()
            self._flusher = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _raise_writer_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _write_filled(self) -> None:
        while True:
            item = self._filled.get()
            if item is None:
                self._filled.task_done()
                return
            buffer, count = item
            try:
                if self._error is None:  # after a failure the rest is dropped, not written
                    write_all(self._fd, memoryview(buffer)[:count])
                    self._unflushed += count
                    if self._unflushed >= _FLUSH_EVERY:
                        self._unflushed = 0
                        self._flush_wanted.set()
            except OSError as error:
                self._error = error
            finally:
                self._written.put((buffer, count))
                self._filled.task_done()

    def _hash_written(self) -> None:
        while True:
            item = self._written.get()
            if item is None:
                self._written.task_done()
                return
            buffer, count = item
            if self._error is None:
                self._hasher.update(memoryview(buffer)[:count])
            self._free.put(buffer)
            self._written.task_done()

    def _flush_when_asked(self) -> None:
        while True:
            self._flush_wanted.wait()
            self._flush_wanted.clear()
            if self._closing:
                return
            _flush(self._fd)
