"""A download's partial file: appended to and hashed as the bytes arrive.

The socket's thread writes and hashes each chunk itself: on loopback that beat handing batches
to worker threads (their wake-ups and the GIL cost more than the overlap gained), and a network
is slower still. A flusher thread pushes the written bytes to the disk every so often, so the
flush that makes a finished file durable is short and a long download's bytes are never far
from the disk. A resumed download first re-hashes the bytes it already has, so the digest covers
the whole file; the file's length is where it resumes.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

_REHASH_BLOCK = 8 << 20
_FLUSH_EVERY = 64 << 20  # bytes written between two flushes to the disk


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
    """A partial file being filled: `open` resumes it, `write` appends, `hexdigest` ends it."""

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
        self._flusher = threading.Thread(target=self._flush_when_asked, name="pull-flusher")
        self._flusher.daemon = True
        self._flusher.start()
        return have

    def write(self, chunk: bytes) -> None:
        """Append and hash one chunk; a full disk raises OSError(ENOSPC) here."""
        write_all(self._fd, chunk)
        self._hasher.update(chunk)
        self._unflushed += len(chunk)
        if self._unflushed >= _FLUSH_EVERY:
            self._unflushed = 0
            self._flush_wanted.set()

    def restart(self) -> None:
        """Throw away what was written (the server ignored the Range): start from byte 0."""
        os.ftruncate(self._fd, 0)
        os.lseek(self._fd, 0, os.SEEK_SET)
        self._hasher = new_hasher(self._algorithm, self._size)

    def hexdigest(self) -> str:
        """Digest of the whole file, once its bytes are on the disk."""
        os.fsync(self._fd)
        return str(self._hasher.hexdigest())

    def close(self) -> None:
        if self._flusher is not None:
            self._closing = True
            self._flush_wanted.set()
            self._flusher.join()
            self._flusher = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _flush_when_asked(self) -> None:
        while True:
            self._flush_wanted.wait()
            self._flush_wanted.clear()
            if self._closing:
                return
            _flush(self._fd)
