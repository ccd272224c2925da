"""A session file's lines as untrusted JSON: bounded lines, bounded nesting, bounded messages.

A recording is data from anywhere (a download, a damaged disk, a crafted file). Reading it must
end in the format's ValueError, never in another exception: a 100,000-deep JSON list is a
RecursionError inside `json.loads`, a multi-GiB line would be read whole before any check, and
an error message that quoted a value as `repr` would itself recurse or run to megabytes. The
helpers here keep each of those bounded, so `engine.kv.events` and `engine.kv.replay` only check
meaning.
"""

from __future__ import annotations

import json
import reprlib
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

from kvscope.engine.input_file import open_input_file

# An event line lists at most one table's blocks (a 10^6-token context is ~60k blocks of 16).
MAX_LINE_BYTES = 64 << 20
# The header lists every cached block of the pool (up to ~10^7 of them, ~10 bytes each).
MAX_HEADER_BYTES = 256 << 20
# The first bytes read of a file, to refuse one that does not start like a session file (a
# header is a JSON object) before reading a line of up to MAX_HEADER_BYTES.
SNIFF_BYTES = 4096
# Every int the format carries fits the int64 arrays the replay keeps (seq ids, block ids).
MAX_INT = (1 << 63) - 1
# An int where a float is expected is taken as one; past this it has no float (OverflowError).
MAX_FLOAT_INT = 1 << 1000

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxtuple = 2, 6, 4, 6
_REPR.maxstring, _REPR.maxlong, _REPR.maxother = 60, 30, 60


def shown(value: object) -> str:
    """`repr(value)` cut short, for error messages: never deep, never long."""
    return _REPR.repr(value)


def load_json(text: str | bytes) -> Any:
    """`json.loads`, with nesting too deep for the parser a ValueError like any bad JSON."""
    try:
        return json.loads(text)
    except RecursionError:
        # The format nests three levels at most; the parser gives up near the recursion limit.
        raise ValueError("JSON nested too deeply (the format nests 3 levels)") from None


def numbered_lines(path: Path, skip_header: bool = True) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-empty line after the header, read one at a time, so a
    file of any size replays in bounded memory; a line over MAX_LINE_BYTES or not UTF-8 is a
    ValueError naming it."""
    with open_input_file(path, "KV event file") as f:
        if skip_header:
            f.readline(MAX_HEADER_BYTES + 1)
        number = 1
        while raw := f.readline(MAX_LINE_BYTES + 1):
            number += 1
            text = decode_line(path, number, raw, MAX_LINE_BYTES)
            if text:
                yield number, text


def decode_line(path: Path, number: int, raw: bytes, limit: int) -> str:
    """One line's text without its line ending; ValueError when too long or not UTF-8."""
    # Measured before the ending is cut: a line at the cap is not copied to be refused.
    if len(raw) > limit and not (len(raw) == limit + 1 and raw.endswith(b"\n")):
        raise ValueError(f"{path}:{number}: line is longer than {limit >> 20} MiB")
    raw = raw.rstrip(b"\r\n")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}:{number}: not UTF-8 text (byte {e.start})") from None


def decode_field(value: Any, hint: Any, where: str) -> Any:
    """`value` as JSON gives it, checked against (and converted to) the field type `hint` of an
    event dataclass; ValueError naming `where` when it is not of that type."""
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        if ok and value > MAX_INT:
            raise ValueError(f"{where} is {shown(value)}, above the format's limit 2**63 - 1")
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and isinstance(value, int) and abs(value) > MAX_FLOAT_INT:
            raise ValueError(f"{where} is {shown(value)}, too large for a number of seconds")
        value = float(value) if ok else value
    elif hint is str:
        ok = isinstance(value, str)
    elif isinstance(hint, types.UnionType):  # only `str | None` so far
        if value is None:
            return None
        return decode_field(value, next(a for a in get_args(hint) if a is not type(None)), where)
    else:  # tuple[X, ...] or a fixed tuple[X, Y, Z]
        args = get_args(hint)
        homogeneous = len(args) == 2 and args[1] is Ellipsis
        ok = isinstance(value, list) and (homogeneous or len(value) == len(args))
        if ok:
            item_types = [args[0]] * len(value) if homogeneous else args
            return tuple(decode_field(v, t, where) for v, t in zip(value, item_types, strict=True))
    if not ok:
        raise ValueError(f"{where} must be {_type_name(hint)}, got {shown(value)}")
    return value


def _type_name(hint: Any) -> str:
    return {bool: "a bool", int: "an int >= 0", float: "a number", str: "a string"}.get(
        hint, f"a list ({hint})"
    )
