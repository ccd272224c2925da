"""Snapshot -> RGBA image of the block pool, with numpy only (no Python loop over blocks).

Each physical block is a square cell of `cell_px` pixels, laid out row by row, `cols` per row,
with a one-pixel gap. A cell is a pixel pattern over a few colours:
- a used block fills left to right in its owner's group colour as its slots fill (the rest is a
  dark shade of the same colour: held but empty);
- a reserved block (contiguous allocator, nothing written yet) is hatched in its owner's colour;
- a shared block (ref count > 1) gets a ring toward white (toward ink on the light map),
  stronger the more sequences share it;
- a free block is flat dark grey; a cached one (free, keeping a hashed prefix) is a free cell
  with a grey core: free space that still holds something.
When a sequence is selected every other block is dimmed toward the background.
Cells too small for a pattern fall back to blended colours (fill and sharing as brightness).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from kvscope.app.core.request_ids import group_of
from kvscope.app.desktop.blockmap import colors
from kvscope.engine.kv.snapshot import BlockState, KVSnapshot

MAX_CELL_PX = 24
SHADE = 0.72  # the empty part of a held block: its colour moved this far toward the background
RESERVED_STRIPE = 0.25  # reserved stripes: the owner colour moved this far toward the background
DIM = 0.8  # blocks outside the selection move this far toward the background
# Ring colour by ref count 2, 3, 4+: the owner colour moved this far toward the theme's ring
# colour (white on the dark map, ink on the light one).
RING_WHITENESS = (0.55, 0.8, 1.0)


# Pixel codes in a cell pattern: which of the block's colours a pixel takes.
BG, FG, RING, LIT, MID, GAP = range(6)


@dataclass(frozen=True)
class CellStyle:
    """Per block: which colour set it uses and what picks its pixel pattern.

    A colour set is the six colours (by pixel code) one kind of block can show; there are few
    of them (selection x state kind x share level x sequence), so pixels are gathered straight
    from this small table.
    """

    key: np.ndarray  # int32 (N,): row of `table`
    table: np.ndarray  # uint32 (K, 6) packed RGBA, columns indexed by the pixel codes
    # int32 (N,): the cell's shape class, (variant * (block_size + 1) + filled) * 2 + shared,
    # variant 0 fill bar, 1 hatch, 2 core; one lookup turns it into a pattern at any cell size.
    shape: np.ndarray
    block_size: int
    blank_key: int  # the colour set of empty space (past the last block)

    def color(self, code: int) -> np.ndarray:
        """Packed colour of each block for one pixel code (FG: the owner's or flat colour)."""
        return self.table[self.key, code]

    @property
    def filled(self) -> np.ndarray:  # slots drawn as filled (block_size for flat cells)
        return (self.shape // 2) % (self.block_size + 1)

    @property
    def hatch(self) -> np.ndarray:  # reserved, nothing written yet
        return self.shape // (2 * (self.block_size + 1)) == HATCH

    @property
    def core(self) -> np.ndarray:  # cached: a free cell with a core
        return self.shape // (2 * (self.block_size + 1)) == CORE

    @property
    def shared(self) -> np.ndarray:  # ref count > 1
        return self.shape % 2 == 1


def grid_shape(num_blocks: int, aspect: float = 1.0) -> tuple[int, int]:
    """(cols, rows) of square cells that fill an area of width/height = aspect best.

    Among column counts near sqrt(n * aspect) it takes the one giving the biggest cells, a
    multiple of 8 when that costs under 3% of cell size (row starts are then easy block ids).
    """
    n = max(1, num_blocks)
    aspect = max(aspect, 1e-3)
    guess = np.sqrt(n * aspect)
    cols = np.arange(max(1, int(guess / 2)), min(n, int(2 * guess) + 2) + 1)
    rows = -(-n // cols)
    fit = np.minimum(aspect / cols, 1.0 / rows)
    good = fit >= fit.max() * 0.97
    round_cols = good & (cols % 8 == 0)
    best = np.flatnonzero(round_cols)[0] if round_cols.any() else int(np.argmax(fit))
    return int(cols[best]), int(rows[best])


def cell_pixels(cols: int, rows: int, width_px: int, height_px: int) -> int:
    """Pixels per cell so the image roughly matches the view (no scaling artefacts)."""
    fit = min(width_px / max(cols, 1), height_px / max(rows, 1))
    return int(np.clip(np.floor(fit), 1, MAX_CELL_PX))


def owner_rows(owner: np.ndarray, ids: np.ndarray, unknown: int, free: int) -> np.ndarray:
    """Row of each block's owner in a per-sequence table (`unknown` if unlisted, `free` if none).

    Sequence ids are a counter, so a dense lookup table indexed by id beats a sorted search.
    """
    top = int(max(owner.max(initial=-1), ids.max(initial=-1)))
    if top > 4 * len(owner) + 1_000_000:  # ids too sparse for a dense table
        pos = np.searchsorted(ids, owner)
        pos_ok = np.minimum(pos, max(len(ids) - 1, 0))
        known = (pos < len(ids)) & (ids[pos_ok] == owner) if len(ids) else owner < -1
        return np.where(owner < 0, free, np.where(known, pos, unknown))
    lut = np.full(top + 2, unknown, dtype=np.int32)
    lut[ids] = np.arange(len(ids), dtype=np.int32)
    lut[-1] = free  # owner -1 indexes the last entry
    return lut[owner]


@dataclass(frozen=True)
class OwnerColors:
    """The snapshot's sequences by id, their group colours, then the flat colours' rows."""

    ids: np.ndarray  # int64 seq ids, sorted
    base: np.ndarray  # uint32 packed: one row per sequence, then unknown, free, cached, blank
    theme: colors.MapColors

    @property
    def unknown(self) -> int:
        return len(self.ids)

    @property
    def free(self) -> int:
        return len(self.ids) + 1

    @property
    def cached(self) -> int:
        return len(self.ids) + 2


def owner_colors(snapshot: KVSnapshot) -> OwnerColors:
    """Per-sequence colours; the per-sequence work is tiny next to the per-block arrays."""
    seqs = sorted(snapshot.sequences, key=lambda s: s.seq_id)
    theme = colors.active()
    group_colors = [colors.group_color(group_of(s.request_id)) for s in seqs]
    flat = (theme.unknown_hex, theme.free_hex, theme.cached_hex, theme.background_hex)
    base = np.array([*group_colors, *(theme.packed(h) for h in flat)], dtype=np.uint32)
    return OwnerColors(np.array([s.seq_id for s in seqs], dtype=np.int64), base, theme)


def selection_mask(snapshot: KVSnapshot, selected: Collection[int]) -> np.ndarray:
    """Blocks in the tables or reservations of the selected sequences."""
    mask = np.zeros(snapshot.num_blocks, dtype=bool)
    chosen = [s for s in snapshot.sequences if s.seq_id in selected]
    blocks = [b for s in chosen for b in (*s.block_table, *s.reserved_blocks)]
    if blocks:
        mask[np.asarray(blocks, dtype=np.int64)] = True
    return mask


# How a block's state picks its colours: kinds 0 free, 1 used, 2 reserved, 3 cached.
KINDS, LEVELS = 4, 4  # LEVELS: share levels 0 (not shared) and ref count 2, 3, 4+
FILL, HATCH, CORE = 0, 1, 2  # cell shape variants
_VARIANT_OF_KIND = np.array([FILL, FILL, HATCH, CORE], dtype=np.int32)
_KIND_OF_STATE = np.zeros(256, dtype=np.int32)
_KIND_OF_STATE[BlockState.USED] = 1
_KIND_OF_STATE[BlockState.RESERVED] = 2
_KIND_OF_STATE[BlockState.CACHED] = 3


def _color_table(base: np.ndarray, dimmed_half: bool, theme: colors.MapColors) -> np.ndarray:
    """Colour sets [dim, kind, share level, row, code] for per-row base colours; the dimmed
    half (dim = 1) only when there is a selection. Rings move toward the theme's ring colour
    (white on the dark map, ink on the light one)."""
    background = theme.packed(theme.background_hex)
    back = np.full_like(base, background)
    white = np.full_like(base, theme.packed(theme.ring_hex))
    shade = colors.mix(base, back, SHADE)
    free = np.full_like(base, theme.packed(theme.free_hex))
    fg = np.stack([base, base, colors.mix(base, back, RESERVED_STRIPE), base])  # [kind, row]
    bg = np.stack([base, shade, shade, free])
    mid = colors.mix(fg, bg, 0.5)
    ring = np.stack([base] + [colors.mix(base, white, w) for w in RING_WHITENESS])  # [level, row]
    lit = np.stack([base] + [colors.mix(base, white, 0.15 * lvl) for lvl in (1, 2, 3)])
    shape = (KINDS, LEVELS, len(base))
    by_kind = [np.broadcast_to(c[:, None, :], shape) for c in (bg, fg)]
    by_level = [np.broadcast_to(c[None, :, :], shape) for c in (ring, lit)]
    table = np.stack(
        [*by_kind, *by_level, np.broadcast_to(mid[:, None, :], shape), np.full(shape, back[0])],
        axis=-1,
    )  # codes BG, FG, RING, LIT, MID, GAP
    if not dimmed_half:
        return table[None]
    dimmed = colors.mix(table, np.full_like(table, background), DIM)
    dimmed[..., GAP] = background
    return np.stack([table, dimmed])


def cell_style(
    snapshot: KVSnapshot,
    selected: Collection[int] = (),
    window: slice = slice(None),
    palette: OwnerColors | None = None,
) -> CellStyle:
    """Per-block colour-set keys with numpy only, for the blocks in `window` (the lens draws a
    slice of a large pool; the rest is never touched). `palette`: owner_colors(snapshot), when
    the caller has it already."""
    palette = palette or owner_colors(snapshot)
    num_rows = len(palette.base)
    free, cached = palette.free, palette.cached

    state = snapshot.state[window]
    kind = _KIND_OF_STATE[state]
    row = owner_rows(snapshot.owner[window], palette.ids, palette.unknown, free)
    row = np.where(kind == 0, free, np.where(kind == 3, cached, row))
    used = kind == 1
    ref = snapshot.ref_count[window]
    shared = used & (ref > 1)
    level = np.where(shared, np.minimum(ref - 1, 3), 0).astype(np.int32)
    key = (kind * LEVELS + level) * num_rows + row
    if len(selected):
        outside = ~selection_mask(snapshot, selected)[window]
        key += outside.astype(np.int32) * (KINDS * LEVELS * num_rows)

    bs = max(snapshot.block_size, 1)
    filled = np.where(used, np.clip(snapshot.filled[window], 0, bs), bs)
    shape = (_VARIANT_OF_KIND[kind] * (bs + 1) + filled) * 2 + shared
    return CellStyle(
        key=key.astype(np.int32),
        table=_color_table(palette.base, bool(len(selected)), palette.theme).reshape(-1, 6),
        blank_key=num_rows - 1,
        shape=shape.astype(np.int32),
        block_size=bs,
    )


@lru_cache(maxsize=32)
def _layout(cell_px: int) -> tuple[int, np.ndarray]:
    """(inner size, pattern table) for a cell size: cell_px * cell_px pixel codes per pattern.

    Pattern ids: k in 0..inner fills k columns; inner + 1 is the hatch, inner + 2 the core;
    adding inner + 3 marks the block shared (a ring where the cell is big enough, else brighter
    filled pixels). One-pixel cells show partial and reserved blocks as a half tone (MID).
    """
    s = cell_px
    gap = 1 if s >= 4 else 0
    inner = s - gap
    r, c = np.mgrid[0:s, 0:s]
    is_gap = (r >= inner) | (c >= inner)
    ring_ok = inner >= 6
    is_ring = ~is_gap & ((r == 0) | (c == 0) | (r == inner - 1) | (c == inner - 1))
    if inner == 1:
        base = [np.full((s, s), code) for code in (MID, FG, MID, FG)]
    else:
        hatch = (r + c) % (3 if inner >= 3 else 2) == 0
        m = max(1, inner // 4) if inner >= 5 else 0
        core = (r >= m) & (r < inner - m) & (c >= m) & (c < inner - m)
        base = [np.where(c < k, FG, BG) for k in range(inner + 1)]
        base += [np.where(hatch, FG, BG), np.where(core, FG, BG)]
    shared = [np.where(is_ring, RING, p) if ring_ok else np.where(p == FG, LIT, p) for p in base]
    patterns = [np.where(is_gap, GAP, p).astype(np.int8).ravel() for p in base + shared]
    return inner, np.stack(patterns)


@lru_cache(maxsize=32)
def _pattern_of_shape(cell_px: int, bs: int) -> np.ndarray:
    """Pattern id for every shape class (see CellStyle.shape) at one cell size."""
    inner = _layout(cell_px)[0]
    c = np.arange(3 * (bs + 1) * 2)
    shared, filled, variant = c % 2, (c // 2) % (bs + 1), c // (2 * (bs + 1))
    k = (filled * (2 * inner) + bs) // (2 * bs)  # rounded number of filled columns
    k = np.where(filled > 0, np.maximum(k, 1), 0)  # a started block never looks empty...
    k = np.where(filled < bs, np.minimum(k, inner - 1), inner)  # ...nor a partial one full
    k = np.where(variant == FILL, k, inner + variant)
    return (k + shared * (inner + 3)).astype(np.int32)


def compose(style: CellStyle, cols: int, cell_px: int) -> np.ndarray:
    """The RGBA image (rows * cell_px, cols * cell_px, 4) uint8 of a cell style."""
    inner, patterns = _layout(cell_px)
    k = _pattern_of_shape(cell_px, style.block_size)[style.shape]
    key = style.key

    n = len(k)
    rows = -(-n // cols)
    cells = rows * cols
    if cells > n:  # the last row's empty cells: the flat BACKGROUND row of the table
        k = np.concatenate([k, np.full(cells - n, inner, dtype=k.dtype)])
        key = np.concatenate([key, np.full(cells - n, style.blank_key, dtype=np.int32)])
    s = cell_px
    # Pixel codes laid out as the image (rows, y, cols, x); adding each cell's colour-set offset
    # makes the one contiguous copy, so the colour gather lands in image order.
    codes = np.take(patterns, k, axis=0).reshape(rows, cols, s, s).transpose(0, 2, 1, 3)
    index = codes + (key.astype(np.int32) * 6).reshape(rows, 1, cols, 1)
    pixels = np.take(style.table.ravel(), index)
    return pixels.reshape(rows * s, cols * s).view(np.uint8).reshape(rows * s, cols * s, 4)


def rasterize(
    snapshot: KVSnapshot, cols: int, cell_px: int, selected: Collection[int] = ()
) -> np.ndarray:
    return compose(cell_style(snapshot, selected), cols, cell_px)
