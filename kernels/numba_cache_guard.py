"""numba's disk cache, shared safely by processes that compile into it at once.

numba's cache keeps one index per function (signature -> data file) and numbers the data files
as it saves them, with no lock between processes: two processes saving different signatures of
one function at the same moment can each read the index before the other wrote it, pick the
same data file, and leave one signature's entry pointing at the other's machine code. numba then
calls that code with arguments of the wrong types, and the process segfaults on that call, and
on it again in every later process (numba issues #4807, #10128). It happens on a first compile
on a machine: the app and its background compile, two `kvscope` processes, the test suite's two
workers on a fresh machine.

`guard(module)` gives each cached kernel of a jitted module a cache that takes one lock file in
the cache folder around every read and write of it (reads too: an index is written before its
data file), and that refuses an entry whose signature is not the one asked for, compiling
instead. Loads and saves take milliseconds; the compile itself runs outside the lock.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType
from typing import Any

import filelock
from numba.core import sigutils
from numba.core.caching import FunctionCache
from numba.core.dispatcher import Dispatcher

logger = logging.getLogger(__name__)

LOCK_NAME = "kvscope-numba-cache.lock"  # in the cache folder, beside numba's own files
# A lock held this long belongs to a process stuck mid-write: go on without the cache (a load
# compiles instead, a save is skipped) rather than stall a launch behind it. So too where the
# lock file cannot be made (a cache folder turned read-only).
LOCK_WAIT_S = 60.0


class GuardedFunctionCache(FunctionCache):
    """numba's cache of one function's compiled code, read and written under `lock`."""

    def __init__(self, py_func: Any, lock: filelock.BaseFileLock) -> None:
        super().__init__(py_func)  # type: ignore[no-untyped-call]
        self._lock = lock

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        try:
            with self._lock.acquire(timeout=LOCK_WAIT_S):
                cres = super().load_overload(sig, target_context)  # type: ignore[no-untyped-call]
        except (filelock.Timeout, OSError) as e:
            logger.warning("numba's cache cannot be read (%s); compiling instead", e)
            return None
        if cres is None:
            return None
        args, _ = sigutils.normalize_signature(sig)  # type: ignore[no-untyped-call]
        if tuple(cres.signature.args) != tuple(args):
            # An entry another process mislabelled before this guard: calling it would read
            # the arguments as other types. Compile; the save then writes this signature's code.
            logger.warning(
                "numba's cache holds %s's code for %s under %s; recompiling",
                self._name,
                cres.signature.args,
                args,
            )
            return None
        return cres

    def save_overload(self, sig: Any, data: Any) -> None:
        try:
            with self._lock.acquire(timeout=LOCK_WAIT_S):
                super().save_overload(sig, data)  # type: ignore[no-untyped-call]
        except (filelock.Timeout, OSError) as e:
            logger.warning("numba's cache cannot be written (%s); not saving %s", e, self._name)


def guard(module: ModuleType, cache_folder: Path) -> int:
    """Give every cached kernel in `module` a `GuardedFunctionCache` locked by one file in
    `cache_folder` (numba's NUMBA_CACHE_DIR); returns how many it guarded. Call it before the
    kernels' first calls: a load already made went through numba's own cache."""
    cache_folder.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(cache_folder / LOCK_NAME, thread_local=False)
    guarded = 0
    for value in vars(module).values():
        if not isinstance(value, Dispatcher) or value.__module__ != module.__name__:
            continue  # a kernel imported from another module is guarded by its own
        cache = getattr(value, "_cache", None)
        if isinstance(cache, GuardedFunctionCache) or not isinstance(cache, FunctionCache):
            continue  # guarded already, or not cached on disk (numba's NullCache)
        value._cache = GuardedFunctionCache(value.py_func, lock)  # type: ignore[attr-defined]
        guarded += 1
    return guarded
