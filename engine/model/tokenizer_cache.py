"""Converted GGUF tokenizers kept on disk as fast-tokenizer JSON, and the bundled model's shipped.

transformers converts a GGUF tokenizer by re-reading the whole file with gguf.GGUFReader, which
takes several seconds for a 49k vocabulary (4 s of a first launch on the 2-core dev machine);
loading the saved result takes a fraction of one.

Two places are looked in, in order:
- shipped: entries written at build time (`python -m kvscope.engine.model.ship_tokenizer
  --write`, run by `make setup` and the installer build) into this package's
  `shipped_tokenizers/`. They are keyed by the GGUF's tokenizer content (its `tokenizer.*`
  metadata and architecture) and the transformers version, not by path or mtime: the install
  path differs from the build's. A missing, stale (other content or transformers version) or
  damaged shipped entry is passed over, never an error: the user cache and then a conversion
  follow.
- the user cache: keyed by the GGUF file's path, size and mtime, so an edited or replaced file
  misses; written after every conversion.
Generated, not committed: the files are ~2 MB of JSON per model and tied to the transformers
version that wrote them, which `make setup` pins at build time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import platformdirs
import transformers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

# Bump when what an entry holds changes, so old entries stop matching.
CACHE_FORMAT = 1
# Written last, listing every file of the entry: a missing file means the entry was damaged.
MANIFEST = "kvscope-tokenizer-cache.json"


def shipped_root() -> Path:
    """The package's folder of build-time conversions (absent until `--write` ran)."""
    return Path(__file__).with_name("shipped_tokenizers")


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


def content_key(metadata: Mapping[str, Any]) -> str:
    """What a conversion reads (the architecture, every `tokenizer.*` field) plus the entry
    format and the transformers version that converts: equal keys, equal tokenizers."""
    identity = {
        "format": CACHE_FORMAT,
        "transformers": transformers.__version__,
        "architecture": metadata.get("general.architecture"),
        "tokenizer": {k: v for k, v in metadata.items() if k.startswith("tokenizer.")},
    }
    text = json.dumps(identity, sort_keys=True, default=_plain, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy arrays and scalars, exactly (never a truncated repr)
        return value.tolist()
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot key a tokenizer on a {type(value).__name__} value")


def shipped_tokenizer(metadata: Mapping[str, Any]) -> PreTrainedTokenizerBase | None:
    """The shipped conversion for this tokenizer content, or None (missing, stale, damaged)."""
    entry = shipped_root() / content_key(metadata)
    if not entry.is_dir():
        return None
    try:
        return _load(entry)
    except Exception as e:  # a damaged install: convert instead, and say why (never fail a load)
        logger.warning("shipped tokenizer %s is unreadable (%s); converting instead", entry, e)
        return None


def cached_tokenizer(
    gguf_path: Path,
    convert: Callable[[], PreTrainedTokenizerBase],
    on_convert: Callable[[], None] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> PreTrainedTokenizerBase:
    """The shipped tokenizer for `metadata`'s content (when given), else the cached one for
    `gguf_path`, else `convert()`'s result, which is then cached.

    `on_convert` is called just before a conversion (a cache miss): the slow step a caller may
    want to announce (Gemma 3's 262k tokens take transformers 30 s or more; the cached copy a
    few seconds)."""
    if metadata is not None:
        shipped = shipped_tokenizer(metadata)
        if shipped is not None:
            return shipped
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
    store_entry(tokenizer, entry)
    return tokenizer


def _load(entry: Path) -> PreTrainedTokenizerBase:
    files = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))["files"]
    missing = [name for name in files if not (entry / name).is_file()]
    if missing:
        raise FileNotFoundError(f"missing {missing}")
    # The generic fast class, not the one tokenizer_config.json names: in transformers 5 a
    # family class (GemmaTokenizer) rebuilds its pipeline from its own defaults instead of
    # reading tokenizer.json's, so a GGUF converted with another pipeline came back different.
    tokenizer: PreTrainedTokenizerFast = PreTrainedTokenizerFast.from_pretrained(
        str(entry), trust_remote_code=False
    )
    return tokenizer


def store_entry(tokenizer: PreTrainedTokenizerBase, entry: Path, source: str = "") -> None:
    """Save into a temp folder, then rename it into place, so no reader sees half an entry."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
        try:
            tokenizer.save_pretrained(str(staging))
            files = sorted(p.name for p in staging.iterdir())
            manifest = {"files": files, "source": source, "transformers": transformers.__version__}
            (staging / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
            os.replace(staging, entry)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # only still there if the rename failed
    except Exception as e:  # the cache is a convenience: a full disk must not fail the load
        # (tokenizers' Rust side reports "No space left on device" as a plain Exception).
        # Another process may have stored the same entry first; that one is as good as ours.
        if not (entry / MANIFEST).is_file():
            logger.warning("cannot cache the tokenizer in %s: %s", entry, e)
