"""Converted GGUF tokenizers kept on disk as fast-tokenizer JSON.

transformers converts a GGUF tokenizer by re-reading the whole file with gguf.GGUFReader, which
takes several seconds for a 49k vocabulary; loading the saved result takes a fraction of one.
Entries are keyed by the GGUF file's path, size and mtime, so an edited or replaced file misses.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import platformdirs
import transformers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

# Bump when what an entry holds changes, so old entries stop matching.
CACHE_FORMAT = 1
# Written last, listing every file of the entry: a missing file means the entry was damaged.
MANIFEST = "kvscope-tokenizer-cache.json"


def cache_root() -> Path:
    override = os.environ.get("KVSCOPE_DATA_DIR")
    base = Path(override) / "cache" if override else Path(platformdirs.user_cache_dir("KVScope"))
    return base / "tokenizers"


def cache_key(gguf_path: Path) -> str:
    """The file's identity plus the transformers version, whose converter produced the entry."""
    resolved = Path(gguf_path).resolve()
    stat = resolved.stat()
    version = transformers.__version__
    identity = [CACHE_FORMAT, str(resolved), stat.st_size, stat.st_mtime_ns, version]
    digest = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:24]
    return f"{resolved.stem}-{digest}"


def cached_tokenizer(
    gguf_path: Path,
    convert: Callable[[], PreTrainedTokenizerBase],
    on_convert: Callable[[], None] | None = None,
) -> PreTrainedTokenizerBase:
    """The cached tokenizer for `gguf_path`, or `convert()`'s result, which is then cached.

    `on_convert` is called just before a conversion (a cache miss): the slow step a caller may
    want to announce (Gemma 3's 262k tokens take transformers 30 s or more; the cached copy a
    few seconds)."""
    entry = cache_root() / cache_key(gguf_path)
    if entry.exists():
        try:
            return _load(entry)
        except Exception as e:  # any damage (bad JSON, missing files): rebuild, never fail a load
            logger.warning("tokenizer cache entry %s is unreadable (%s); rebuilding it", entry, e)
            shutil.rmtree(entry, ignore_errors=True)
    if on_convert is not None:
        on_convert()
    tokenizer = convert()
    _store(tokenizer, entry)
    return tokenizer


def _load(entry: Path) -> PreTrainedTokenizerBase:
    files = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))["files"]
    missing = [name for name in files if not (entry / name).is_file()]
    if missing:
        raise FileNotFoundError(f"missing {missing}")
    # The generic fast class, not the one tokenizer_config.json names: in transformers 5 a
    # family class (GemmaTokenizer) rebuilds its pipeline from its own defaults instead of
    # reading tokenizer.json's, so a GGUF converted with another pipeline came back different.
    return PreTrainedTokenizerFast.from_pretrained(str(entry), trust_remote_code=False)


def _store(tokenizer: PreTrainedTokenizerBase, entry: Path) -> None:
    """Save into a temp folder, then rename it into place, so no reader sees half an entry."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
        try:
            tokenizer.save_pretrained(str(staging))
            files = sorted(p.name for p in staging.iterdir())
            (staging / MANIFEST).write_text(json.dumps({"files": files}), encoding="utf-8")
            os.replace(staging, entry)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # only still there if the rename failed
    except Exception as e:  # the cache is a convenience: a full disk must not fail the load
        # (tokenizers' Rust side reports "No space left on device" as a plain Exception).
        # Another process may have stored the same entry first; that one is as good as ours.
        if not (entry / MANIFEST).is_file():
            logger.warning("cannot cache the tokenizer in %s: %s", entry, e)
