"""A block of ARCHITECTURE.md that a script generates, between a begin and an end marker: the one
on show, and writing it anew (tests/architecture_picture.py, tests/module_tables.py)."""

from __future__ import annotations

from pathlib import Path

ARCHITECTURE = Path(__file__).resolve().parents[1] / "ARCHITECTURE.md"


def shown_block(begin: str, end: str, path: Path = ARCHITECTURE) -> str | None:
    """The block as the file has it, markers included; None when a marker is missing."""
    text = path.read_text(encoding="utf-8")
    if begin not in text or end not in text:
        return None
    return text[text.index(begin) : text.index(end) + len(end)]


def write_block(block: str, begin: str, end: str, path: Path = ARCHITECTURE) -> None:
    """Put `block` where the file's block between the markers is."""
    old = shown_block(begin, end, path)
    if old is None:
        raise SystemExit(f"{path} has no {begin!r} ... {end!r} block to write")
    path.write_text(path.read_text(encoding="utf-8").replace(old, block), encoding="utf-8")
