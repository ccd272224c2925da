"""Opening a file a user named (a recording, a model, the settings, a workload) as untrusted.

A path from a user can name anything: a folder, a FIFO whose open blocks until a writer comes,
a device that reads forever (a symlink to /dev/zero was once reported as "does not exist", and
read without end by a reader that trusted it), or a file far larger than its format holds (a
1 GB file of NUL bytes was refused only after 785 MB had been read). Here the path is looked at
before a byte is read: it must be a regular file, no larger than the caller's bound, and the
open never blocks. What is wrong is an `InputFileError` naming the path: a ValueError and an
OSError both, so every caller that shows a reader's ValueError (the command line, the app's
dialogs) or catches OSError shows it; a missing file is `InputFileMissing`, a
FileNotFoundError as well.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "InputFileError",
    "InputFileMissing",
    "check_input_file",
    "open_input_file",
    "read_input_file",
]

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
)


class InputFileError(OSError, ValueError):
    """A user-given file that cannot be read as one: not a regular file, too large, unreadable."""


class InputFileMissing(FileNotFoundError, InputFileError):
    """A user-given file that does not exist (or a symlink whose target does not)."""


def check_input_file(path: str | os.PathLike[str], what: str, max_bytes: int | None = None) -> int:
    """The size of the regular file `path` (symlinks followed); `InputFileError` naming `what`
    and the path when it is missing, not a regular file, or over `max_bytes`."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputFileMissing(_missing(path, what)) from None
    except OSError as e:
        raise InputFileError(f"{what} {path} cannot be read: {e.strerror or e}") from None
    return _check_stat(path, what, st, max_bytes)


def open_input_file(
    path: str | os.PathLike[str], what: str, max_bytes: int | None = None
) -> BinaryIO:
    """`path` opened for reading in binary, after `check_input_file`; checked again on the open
    descriptor (the path may have changed in between), and the open itself never blocks."""
    path = Path(path)
    check_input_file(path, what, max_bytes)
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InputFileMissing(_missing(path, what)) from None
    except OSError as e:
        raise InputFileError(f"{what} {path} cannot be read: {e.strerror or e}") from None
    try:
        _check_stat(path, what, os.fstat(fd), max_bytes)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input_file(path: str | os.PathLike[str], what: str, max_bytes: int) -> bytes:
    """The whole of the regular file `path`, at most `max_bytes` (as `open_input_file`)."""
    with open_input_file(path, what, max_bytes) as f:
        # Its size now, plus one: a file that grew since is read no further than its bound.
        data = f.read(min(os.fstat(f.fileno()).st_size, max_bytes) + 1)
    if len(data) > max_bytes:
        raise InputFileError(f"{what} {path} grew past {_size(max_bytes)} while being read")
    return data


def _check_stat(path: Path, what: str, st: os.stat_result, max_bytes: int | None) -> int:
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        target = f" is a link to {os.path.realpath(path)}, which" if path.is_symlink() else ""
        raise InputFileError(f"{what} {path}{target} is {kind}, not a regular file")
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputFileError(
            f"{what} {path} is {_size(st.st_size)}; this reader takes files up to "
            f"{_size(max_bytes)}"
        )
    return st.st_size


def _missing(path: Path, what: str) -> str:
    if path.is_symlink():
        return f"{what} does not exist: {path} is a link to {os.readlink(path)}, which is missing"
    return f"{what} does not exist: {path}"


def _size(n: int) -> str:
    return f"{n:,} bytes" if n < 1 << 20 else f"{n / 2**20:,.1f} MiB ({n:,} bytes)"
