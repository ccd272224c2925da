"""A big msgpack array decoded a piece at a time, so that no one msgspec call holds the GIL long.

msgspec decodes a whole value in one C call that never lets go of the GIL: a 54 MB KV event
frame took seconds, and every other thread, the GUI's included, stood still for all of it.
msgspec decodes lazily only down to `msgspec.Raw` (a value's bytes, undecoded, found by skipping
over them), and a Raw per token id would cost ~50 bytes and a Python object for every id. So an
array's elements are decoded `count` at a time from the array's body, which needs where the
`count`-th element ends: msgspec, given an array header of `count` and a window of the body that
holds at least that many elements, decodes them and then fails on the bytes left over, naming
their offset ("trailing characters (byte N)"). That offset is the boundary; the elements are then
decoded from exactly the bytes before it. A window too short to hold `count` elements fails as
"truncated" and is doubled. Should a msgspec release word that error otherwise, the rest of the
array is decoded in one call (right, though not in pieces); tests/app/remote/test_kv_frames.py
checks that the pieces are taken."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import msgspec

_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
_TRUNCATED = "truncated"
_decoder = msgspec.msgpack.Decoder()
_tuple = msgspec.msgpack.Decoder(tuple)
Buffer = bytes | memoryview | msgspec.Raw


class NotMsgpack(ValueError):
    """Bytes that are not the msgpack value they should be; the message says what was wrong."""


def array_header(data: Buffer) -> tuple[int, int] | None:
    """(element count, header length) of the msgpack array `data` starts with; None when it is
    not an array."""
    data = memoryview(data)
    if not data:
        return None
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F, 1
    size = {0xDC: 2, 0xDD: 4}.get(first)
    if size is None or len(data) < 1 + size:
        return None
    return int.from_bytes(data[1 : 1 + size], "big"), 1 + size


def _header(count: int) -> bytes:
    if count < 16:
        return bytes((0x90 | count,))
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def kind_of(data: Buffer) -> str:
    """The Python type name a generic decode of `data` would give (for error messages)."""
    data = memoryview(data)
    if not data:
        return "nothing"
    b = data[0]
    if b <= 0x7F or b >= 0xE0 or 0xCC <= b <= 0xD3:
        return "int"
    if 0x80 <= b <= 0x8F or b in (0xDE, 0xDF):
        return "dict"
    if 0x90 <= b <= 0x9F or b in (0xDC, 0xDD):
        return "list"
    if 0xA0 <= b <= 0xBF or b in (0xD9, 0xDA, 0xDB):
        return "str"
    names = {0xC0: "NoneType", 0xC2: "bool", 0xC3: "bool", 0xCA: "float", 0xCB: "float"}
    if b in names:
        return names[b]
    return "bytes" if b in (0xC4, 0xC5, 0xC6) else "Ext"


def array_pieces(data: Buffer, per: int) -> Iterator[tuple[Any, ...]]:
    """The elements of the msgpack array `data` (exactly one array, nothing after it), decoded
    generically, at most `per` to a tuple. Tuples, not lists: the garbage collector stops
    tracking a tuple of plain values at its first collection, so millions of ids held for a
    while do not make every later collection walk them. Raises NotMsgpack."""
    if per < 1:
        raise ValueError(f"per must be at least 1, got {per}")
    head = array_header(data)
    if head is None:
        raise NotMsgpack(f"expected an array, got {kind_of(data)}")
    count, skip = head
    body = memoryview(data)[skip:]
    # A window guess from the body's mean element size, with room for elements above it.
    mean = len(body) // count + 1 if count else 1
    pos, left = 0, count
    while left:
        n = min(per, left)
        end = _piece_end(body, pos, n, mean)
        if end is None:  # the whole rest in one call: it says what is wrong, if anything is
            yield from _chunks(_decode(_header(left), body[pos:]), per)
            return
        yield _decode(_header(n), body[pos:end])
        pos, left = end, left - n
    if pos != len(body):
        raise NotMsgpack(f"{len(body) - pos} bytes after the array's {count} elements")


def _piece_end(body: memoryview, pos: int, n: int, mean: int) -> int | None:
    """Where the `n` elements starting at `pos` end; None when msgspec does not say (bytes that
    are not msgpack, an array cut short, or a msgspec that words its errors otherwise)."""
    header = _header(n)
    window = 2 * n * mean
    while True:
        end = min(len(body), pos + window)
        try:
            _decoder.decode(b"".join((header, body[pos:end])))
            return end  # the window holds exactly n elements
        except msgspec.DecodeError as e:
            text = str(e)
            found = _TRAILING.search(text)
            if found:
                return pos + int(found.group(1)) - len(header)
            if _TRUNCATED not in text or end == len(body):
                return None
            window *= 2


def _decode(header: bytes, rest: memoryview) -> tuple[Any, ...]:
    try:
        return _tuple.decode(b"".join((header, rest)))
    except msgspec.DecodeError as e:
        raise NotMsgpack(str(e)) from None


def _chunks(items: tuple[Any, ...], per: int) -> Iterator[tuple[Any, ...]]:
    for i in range(0, len(items), per):
        yield items[i : i + per]
