"""Byte counts as people write them and as the planner and the load errors print them.

Below everything that reports memory (the planner, the weight plan, the load errors), so that
none of them imports another for a number's text.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_BYTE_UNITS = {
    "": 1,
    "b": 1,
    **{p + "b": 1000 ** (i + 1) for i, p in enumerate("kmgtp")},
    **{p + "ib": 1024 ** (i + 1) for i, p in enumerate("kmgtp")},
}
_BYTES_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_bytes(text: str | int) -> int:
    """'24GiB', '7.5GB', '512MiB', '1.5TB' or a plain integer -> bytes.

    KB/MB/GB/TB/PB are powers of 1000, KiB/MiB/GiB/TiB/PiB powers of 1024; fractions of a byte
    round to the nearest byte.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"byte count {text} is negative")
        return text
    match = _BYTES_RE.fullmatch(str(text))
    unit = _BYTE_UNITS.get(match.group(2).lower()) if match else None
    if match is None or not unit:
        raise ValueError(
            f"{text!r} is not a byte count: use an integer or a number with a unit "
            "(B, KB, MB, GB, TB, PB = powers of 1000; KiB, MiB, GiB, TiB, PiB = powers of 1024)"
        )
    try:
        value = Decimal(match.group(1)) * unit
    except InvalidOperation as e:
        raise ValueError(f"{text!r} is not a byte count") from e
    return int(value.to_integral_value())


def format_bytes(n: int) -> str:
    """Exact count plus decimal and binary readings: '26,843,545,600 B (26.84 GB, 25.00 GiB)'."""
    if abs(n) < 1000:
        return f"{n:,} B"
    return f"{n:,} B ({_scaled(n, 1000, 'B')}, {_scaled(n, 1024, 'iB')})"


def format_binary(n: int) -> str:
    """The short reading, in powers of 1024: '512.00 MiB', '1.50 GiB', '900 B'."""
    return _scaled(n, 1024, "iB")


def _scaled(n: int, base: int, suffix: str) -> str:
    value, prefix = float(n), ""
    for next_prefix in "KMGTP":
        if abs(value) < base:
            break
        value, prefix = value / base, next_prefix
    return f"{value:.2f} {prefix}{suffix if prefix else 'B'}"
