"""A model's headers (its ModelConfig and its weights' shapes and stored kinds), read once per
version of its files.

The settings dialog's model picker reads them when it opens and on every Source or path change,
on the GUI thread: the bundled GGUF's header (a 49,152-token vocabulary as strings) took ~90 ms
a read and the picker read it twice (config, then weights), ~200 ms per open on an idle 2-core
machine and ~430 ms during a long drive. Headers change only with their files, so the key is
each file's (path, size, mtime_ns): a reopen, or a switch back to a model already seen, reads
nothing. `prefetch` fills the cache on a thread of its own, so the first open after the engine
loads costs nothing either.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path
from types import MappingProxyType

from kvscope.engine.input_file import check_input_file
from kvscope.engine.model.loader import default_model_path
from kvscope.engine.model.model_config import ModelConfig
from kvscope.engine.sizing import planner

# A few models a session: the bundled one, the user's own, the ones tried in between.
MAX_ENTRIES = 8
# The files a folder's headers come from (config.json, safetensors headers, a lone .gguf).
FOLDER_SUFFIXES = (".json", ".safetensors", ".gguf")

# Shapes and stored kinds, as read-only views that every caller shares.
WeightsHeader = tuple[MappingProxyType[str, tuple[int, ...]], MappingProxyType[str, str]]
Headers = tuple[ModelConfig, WeightsHeader | None]

log = logging.getLogger(__name__)
_cache: OrderedDict[tuple, Headers] = OrderedDict()
_lock = threading.Lock()  # the GUI thread and a prefetch thread share the cache


def read_headers(model: str | os.PathLike | None) -> Headers:
    """(config, weights header) of a model path (None: the bundled model), as
    engine.sizing.planner.model_config and weights_header give them; a cached copy when its files
    are unchanged. The header's mappings are read-only: every caller shares them. Raises what
    the planner raises for a missing or unreadable model (a failure is not cached)."""
    key = _key(model)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    config = planner.model_config(model)
    read = planner.weights_header(model)
    header: WeightsHeader | None = None
    if read is not None:
        header = (MappingProxyType(dict(read[0])), MappingProxyType(dict(read[1])))
    with _lock:
        _cache[key] = (config, header)
        _cache.move_to_end(key)
        while len(_cache) > MAX_ENTRIES:
            _cache.popitem(last=False)
    return config, header


def cached(model: str | os.PathLike | None) -> bool:
    """Whether `model`'s headers, as its files are now, would be read from the cache."""
    try:
        key = _key(model)
    except OSError:
        return False
    with _lock:
        return key in _cache


def prefetch(model: str | os.PathLike | None) -> threading.Thread:
    """Read `model`'s headers into the cache on a daemon thread (returned, started). A failure
    is logged and left for the dialog, which reads again and says why."""

    def read() -> None:
        try:
            read_headers(model)
        except Exception as e:  # any unreadable model: the picker's own read shows why
            log.info("prefetching the headers of %s failed: %s: %s", model, type(e).__name__, e)

    thread = threading.Thread(target=read, name="kvscope-header-prefetch", daemon=True)
    thread.start()
    return thread


def clear() -> None:
    """Forget every cached header (tests; a user never needs it: changed files miss)."""
    with _lock:
        _cache.clear()


def _key(model: str | os.PathLike | None) -> tuple:
    """The model's files as (path, size, mtime_ns): a file alone, a folder by the files its
    headers are read from. Raises FileNotFoundError naming a missing path."""
    path = default_model_path() if model in (None, "default") else Path(model).expanduser()
    if path.exists() and not path.is_dir() and not path.is_file():
        check_input_file(path, "model path")  # a device or a pipe, named as one
    if path.is_file() and path.suffix.lower() != ".json":
        root, files = path, [path]
    else:  # an HF folder, its config.json (the same model), or a folder holding one .gguf
        root = path if path.is_dir() else path.parent
        if not root.is_dir():
            raise FileNotFoundError(f"model path does not exist: {path}")
        files = sorted(f for f in root.iterdir() if f.suffix.lower() in FOLDER_SUFFIXES)
    stats = []
    for f in files:
        st = f.stat()
        stats.append((str(f.resolve()), st.st_size, st.st_mtime_ns))
    return (str(root.resolve()), *stats)
