"""Bin counts -> RGBA image of the whole pool (the overview above the lens), numpy only.

Invariant: a bin with any held or cached block never looks free. Averaging would lose one used
block among a hundred free ones, so each bin takes the colour of what it holds and its share
only sets the intensity, from a floor that stays visible:
- held (used or reserved) blocks: the colour of the sequence holding at least half of them (a
  neutral "mixed" colour when none does), brighter the larger the held share;
  reserved-only bins use the paler stripe colour of the cell map's hatch, and a bin with a
  shared block moves toward the ring colour, as the cell map's ring does;
- cached blocks (and nothing held): the cached grey, by the same rule;
- free: the free colour, lifted a little where the lens is looking;
- past the last block: the map's background.
With a selection, bins holding none of its blocks are dimmed as the cell map dims its cells.
"""

from __future__ import annotations

import numpy as np

from kvscope.app.desktop.blockmap import colors, raster
from kvscope.app.desktop.blockmap.bins import BinCounts, BinGrid

HELD_FLOOR = 0.55  # intensity of a bin with one held block among many free ones
CACHED_FLOOR = 0.7  # cached grey sits closer to free: it starts higher to stay apart
SHARED_LIFT = 0.3  # a bin with a shared block, moved this far toward the ring colour
LENS_LIFT = 0.1  # free bins inside the lens, moved this far toward the ring colour


def bin_colors(
    counts: BinCounts,
    grid: BinGrid,
    palette: raster.OwnerColors,
    lens: tuple[int, int] | None = None,
    selection: bool = False,
) -> np.ndarray:
    """Packed colour per bin (num_bins,) uint32."""
    theme = palette.theme
    background, free, ring = (
        np.asarray(theme.packed(h), dtype=np.uint32)
        for h in (theme.background_hex, theme.free_hex, theme.ring_hex)
    )
    mixed = colors.mix(ring, free, 0.35)
    blocks = np.maximum(counts.blocks, 1)

    out = np.full(grid.num_bins, free, dtype=np.uint32)
    if lens is not None:
        first, last = grid.bin_of(lens[0]), grid.bin_of(max(lens[1] - 1, lens[0]))
        out[first : last + 1] = colors.mix(free, ring, LENS_LIFT)
    # Colours are worked out only for the bins that hold something: few in a quiet pool.
    holding = np.flatnonzero(counts.held > 0)
    held = counts.held[holding]
    dominant = counts.dominant[holding]
    owner_color = palette.base[np.where(dominant >= 0, dominant, palette.unknown)]
    color = np.where(dominant >= 0, owner_color, mixed)
    paler = np.flatnonzero(counts.used[holding] == 0)  # reserved only
    color[paler] = colors.mix(color[paler], background, raster.RESERVED_STRIPE)
    ringed = np.flatnonzero(counts.shared[holding] > 0)
    color[ringed] = colors.mix(color[ringed], ring, SHARED_LIFT)
    held_t = HELD_FLOOR + (1 - HELD_FLOOR) * held / blocks[holding]
    out[holding] = colors.mix(out[holding], color, held_t)

    keeping = np.flatnonzero((counts.held == 0) & (counts.cached > 0))
    cached_t = CACHED_FLOOR + (1 - CACHED_FLOOR) * counts.cached[keeping] / blocks[keeping]
    out[keeping] = colors.mix(out[keeping], palette.base[[palette.cached]], cached_t)
    if selection:
        out = np.where(counts.selected > 0, out, colors.mix(out, background, raster.DIM))
    return out.astype(np.uint32)


def compose(bin_color: np.ndarray, grid: BinGrid, background: int) -> np.ndarray:
    """RGBA (rows * bin_px, cols * bin_px, 4) uint8: each bin a bin_px square, row by row."""
    cells = grid.rows * grid.cols
    padded = np.full(cells, background, dtype=np.uint32)
    padded[: len(bin_color)] = bin_color
    p = grid.bin_px
    square = np.broadcast_to(
        padded.reshape(grid.rows, 1, grid.cols, 1), (grid.rows, p, grid.cols, p)
    )
    image = np.ascontiguousarray(square).reshape(grid.rows * p, grid.cols * p)
    return image.view(np.uint8).reshape(grid.rows * p, grid.cols * p, 4)
