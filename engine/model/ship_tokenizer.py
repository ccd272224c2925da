"""Writing the converted tokenizers the package ships
(`python -m kvscope.engine.model.ship_tokenizer --write`, run by `make setup` and the installer
build) into engine/model/shipped_tokenizers/.

Apart from engine/model/tokenizer_cache.py, which reads them: converting needs the GGUF loader,
and the loader needs the cache, so the writer sits above both.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from kvscope.engine.model import tokenizer_cache
from kvscope.engine.model.gguf.file import read_gguf
from kvscope.engine.model.gguf.loader import convert_tokenizer
from kvscope.engine.model.tokenizer_cache import MANIFEST, content_key, store_entry


def write_shipped(gguf_path: Path, root: Path | None = None) -> Path:
    """Convert `gguf_path`'s tokenizer afresh into `root` (the shipped folder by default),
    dropping the entries an earlier build wrote for the same file name; returns the entry."""
    gguf_path = Path(gguf_path)
    metadata = read_gguf(gguf_path).metadata
    root = tokenizer_cache.shipped_root() if root is None else root
    entry = root / content_key(metadata)
    if root.is_dir():
        for old in root.iterdir():
            if old != entry and _source_of(old) == gguf_path.name:
                shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(entry, ignore_errors=True)
    store_entry(convert_tokenizer(metadata, gguf_path), entry, gguf_path.name)
    if not (entry / MANIFEST).is_file():
        raise OSError(f"could not write the shipped tokenizer {entry}")
    # mkdtemp made it private; an installed package is read by every user of the machine.
    for path in (entry, *entry.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return entry


def _source_of(entry: Path) -> str:
    try:
        source: str = json.loads((entry / MANIFEST).read_text(encoding="utf-8")).get("source", "")
        return source
    except (OSError, ValueError, AttributeError):
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvscope.engine.model.ship_tokenizer",
        description="Write the converted tokenizers the package ships (make setup runs this).",
    )
    parser.add_argument("--write", action="store_true", required=True)
    parser.add_argument("gguf", nargs="*", type=Path, help="GGUF files (default: the bundled one)")
    args = parser.parse_args(argv)
    if not args.gguf:
        from kvscope.engine.model.loader import default_model_path

        args.gguf = [default_model_path()]
    for path in args.gguf:
        print(f"shipped tokenizer for {path.name}: {write_shipped(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
