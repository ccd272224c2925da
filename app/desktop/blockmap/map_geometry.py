"""How the block map uses its area: one cell per block when cells stay readable, else an
overview of the whole pool in bins over a lens of whole rows at readable cell size."""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.app.desktop.blockmap import raster
from kvscope.app.desktop.blockmap.bins import BinGrid, bin_grid
from kvscope.app.desktop.blockmap.lens import LENS_CELL_PX

MIN_CELL_PX = 6  # below this a cell's fill bar, core and ring no longer read: bin instead
OVERVIEW_SHARE = 0.4  # the overview takes at most this share of the height
CAPTION_PX = 18  # the lens's one-line caption between the overview and the lens
SPACING_PX = 4


@dataclass(frozen=True)
class MapGeometry:
    cols: int  # cells per row (of the whole pool, or of the lens)
    rows: int  # rows of the whole pool at `cols` per row
    cell_px: int
    grid: BinGrid | None = None  # the overview's bins; None: one cell per block, no lens
    overview_px: int = 0  # the overview's height
    visible_rows: int = 0  # the lens's height in rows

    @property
    def binned(self) -> bool:
        return self.grid is not None


def plan(num_blocks: int, width_px: int, height_px: int) -> MapGeometry:
    width_px, height_px = max(width_px, 40), max(height_px, 40)
    cols, rows = raster.grid_shape(num_blocks, width_px / height_px)
    cell_px = raster.cell_pixels(cols, rows, width_px, height_px)
    if cell_px >= MIN_CELL_PX:
        return MapGeometry(cols, rows, cell_px)
    grid = bin_grid(num_blocks, width_px, int(height_px * OVERVIEW_SHARE))
    overview_px = grid.rows * grid.bin_px
    lens_px = height_px - overview_px - CAPTION_PX - 2 * SPACING_PX
    lens_cols = max(1, width_px // LENS_CELL_PX)
    return MapGeometry(
        cols=lens_cols,
        rows=-(-num_blocks // lens_cols),
        cell_px=LENS_CELL_PX,
        grid=grid,
        overview_px=overview_px,
        visible_rows=max(1, lens_px // LENS_CELL_PX),
    )
