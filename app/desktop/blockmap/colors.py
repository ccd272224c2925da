"""Colours of the block map: a qualitative palette for request groups and the pool's state colours.

Every request of a group (app/core/request_ids.py: "conv-12" of "conv-12/r3", "load-3" of
"load-3/7") gets the group's colour, chosen by a stable hash (crc32, not Python's salted
hash()) so it is the same in every run. Colours are packed RGBA uint32 (little-endian, so the
bytes read R, G, B, A), which lets the map gather a whole pixel in one integer.

Each theme has its own set (`MapColors`, `active()` for the theme on show): on the light ground
the palette's hues are darkened until they stand out from the ground (3:1, WCAG's figure for
graphics), free and cached cells are greys of the light ground, and a shared block's ring is
drawn toward ink rather than toward white. The module's constants are the dark set's.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
import numpy.typing as npt

# Kelly's colours of maximum contrast (greys dropped, dark ones lifted to read on a dark map),
# in Kelly's order: neighbours in the list differ most, and numbered groups walk the list.
PALETTE_HEX = (
    "#F3C300",  # vivid yellow
    "#A77BCA",  # purple
    "#F38400",  # orange
    "#A1CAF1",  # light blue
    "#E8354F",  # red
    "#C2B280",  # buff
    "#2BB673",  # green
    "#E68FAC",  # purplish pink
    "#3D8FE0",  # blue
    "#F99379",  # salmon
    "#8672C9",  # violet
    "#F6D06A",  # pale orange-yellow
    "#C2457A",  # purplish red
    "#DCD300",  # greenish yellow
    "#C8634A",  # reddish brown
    "#8DB600",  # yellow-green
    "#B08A66",  # yellowish brown
    "#FF6A3D",  # reddish orange
    "#5FA985",  # sage green
    "#37C5D0",  # cyan
)

BACKGROUND_HEX = "#15171C"  # map background and the gaps between cells
FREE_HEX = "#2A2E37"  # free block: nothing reusable in it
CACHED_HEX = "#6B7587"  # free, but holds a hashed prefix a later request can adopt
UNKNOWN_HEX = "#9A9A9A"  # held by a sequence the snapshot does not list (should not happen)
PAGED_HEX = "#5DADE2"  # series colour of the paged pool in plots and the strip
NAIVE_HEX = "#F5A623"  # series colour of the naive contiguous allocator

_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")


def hex_to_rgba(color: str, alpha: int = 255) -> tuple[int, int, int, int]:
    c = color.lstrip("#")
    return int(c[0:2], 16), int(c[2:4], 16), int(c[4:6], 16), alpha


def _contiguous(values: npt.ArrayLike, dtype: npt.DTypeLike) -> np.ndarray:
    arr = np.asarray(values, dtype=dtype)  # (np.ascontiguousarray would make 0-d arrays 1-d)
    return arr if arr.flags.c_contiguous else arr.copy()


def pack(rgba: np.ndarray | tuple[int, int, int, int]) -> np.ndarray:
    """RGBA uint8 (..., 4) -> uint32 (...), byte order R, G, B, A in memory."""
    return _contiguous(rgba, np.uint8).view("<u4")[..., 0]


def unpack(packed: np.ndarray | np.uint32) -> np.ndarray:
    """uint32 (...) -> RGBA uint8 (..., 4)."""
    return _contiguous(packed, "<u4")[..., None].view(np.uint8)


def mix(a: np.ndarray, b: np.ndarray, t: float | np.ndarray) -> np.ndarray:
    """Per-channel a*(1-t) + b*t of packed colours; t scalar or one value per colour."""
    fa = unpack(a).astype(np.float32)
    fb = unpack(b).astype(np.float32)
    weight = np.asarray(t, dtype=np.float32)[..., None] if np.ndim(t) else np.float32(t)
    out = fa + (fb - fa) * weight
    return pack(np.rint(out).astype(np.uint8))


PALETTE = pack(np.array([hex_to_rgba(h) for h in PALETTE_HEX], dtype=np.uint8))
BACKGROUND = int(pack(hex_to_rgba(BACKGROUND_HEX)))
FREE = int(pack(hex_to_rgba(FREE_HEX)))
CACHED = int(pack(hex_to_rgba(CACHED_HEX)))
UNKNOWN = int(pack(hex_to_rgba(UNKNOWN_HEX)))
WHITE = int(pack((255, 255, 255, 255)))


def luminance(color: str) -> float:
    """WCAG relative luminance of a #RRGGBB colour."""
    channels = [v / 255 for v in hex_to_rgba(color)[:3]]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(a: str, b: str) -> float:
    """WCAG contrast ratio of two colours, 1 to 21."""
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def darkened_to(color: str, ground: str, ratio: float) -> str:
    """`color` scaled toward black (its hue kept) until it stands `ratio` from `ground`."""
    r, g, b, _a = hex_to_rgba(color)
    out, scale = color.upper(), 1.0
    while contrast(out, ground) < ratio and scale > 0:
        scale -= 0.02
        out = "#{:02X}{:02X}{:02X}".format(*(round(c * scale) for c in (r, g, b)))
    return out


@dataclass(frozen=True)
class MapColors:
    """One theme's map colours (hex), and their packed forms for the rasterizer."""

    name: str
    palette_hex: tuple[str, ...]
    background_hex: str  # the map's ground and the gaps between cells
    free_hex: str
    cached_hex: str
    unknown_hex: str
    ring_hex: str  # a shared block's ring: the owner's colour moved toward this
    paged_hex: str
    naive_hex: str
    good_hex: str  # running, prefix hits
    bad_hex: str  # preempted
    neutral_hex: str  # memory used

    @cached_property
    def palette(self) -> np.ndarray:
        return pack(np.array([hex_to_rgba(h) for h in self.palette_hex], dtype=np.uint8))

    def packed(self, color: str) -> int:
        return int(pack(hex_to_rgba(color)))


DARK_MAP = MapColors(
    "dark",
    PALETTE_HEX,
    BACKGROUND_HEX,
    FREE_HEX,
    CACHED_HEX,
    UNKNOWN_HEX,
    "#FFFFFF",
    PAGED_HEX,
    NAIVE_HEX,
    "#2BB673",
    "#E8354F",
    "#A9B0BD",
)
LIGHT_BACKGROUND_HEX = "#FFFFFF"
LIGHT_MAP = MapColors(
    "light",
    tuple(darkened_to(h, LIGHT_BACKGROUND_HEX, 3.0) for h in PALETTE_HEX),
    LIGHT_BACKGROUND_HEX,
    "#E3E6EB",
    "#7F8898",
    "#6A6A6A",
    "#1F2430",
    "#1F6FB2",
    "#B86A00",
    "#1E8A5A",
    "#C62839",
    "#6B7382",
)
MAP_COLORS = {"dark": DARK_MAP, "light": LIGHT_MAP}


def active() -> MapColors:
    """The map colours of the theme on show (app/desktop/palette.py)."""
    from kvscope.app.desktop.palette import current

    return MAP_COLORS[current().name]


def group_color_index(group: str) -> int:
    """Stable palette index of a group. Numbered groups ("load-3") offset a hash of their stem
    by their number, so up to len(PALETTE) consecutive users or chats never share a colour."""
    m = _TRAILING_NUMBER.match(group)
    if m:
        stem, number = m.group(1), int(m.group(2))
        return (zlib.crc32(stem.encode()) + number) % len(PALETTE)
    return zlib.crc32(group.encode()) % len(PALETTE)


def group_color(group: str) -> int:
    """Packed RGBA colour of a group, in the theme on show."""
    return _group_color(group, active().name)


@lru_cache(maxsize=4096)
def _group_color(group: str, theme: str) -> int:
    return int(MAP_COLORS[theme].palette[group_color_index(group)])


def group_hex(group: str) -> str:
    return active().palette_hex[group_color_index(group)]


def css(packed: int) -> str:
    r, g, b, _a = (int(v) for v in unpack(np.uint32(packed)))
    return f"#{r:02X}{g:02X}{b:02X}"


def themed_hex(color: str) -> str:
    """A palette hue as the theme on show draws it (the light theme darkens each to read on
    white); other colours unchanged. Replicas keep a dark-palette hue for the session."""
    upper = color.upper()
    if upper in PALETTE_HEX:
        return active().palette_hex[PALETTE_HEX.index(upper)]
    return color
