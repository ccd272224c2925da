"""A pool too large for one readable cell per block, folded into bins: `blocks_per_bin`
consecutive blocks per bin, the bins laid out row by row, `cols` per row, each drawn as a
square of `bin_px` screen pixels. What each bin holds is counted with numpy only (no Python
loop per block or per bin): blocks by state, shared and selected blocks, and the sequence that
holds most of its blocks (its first owner's, as the cell map colours a shared block).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from kvscope.app.desktop.blockmap import raster
from kvscope.engine.kv.snapshot import BlockState, KVSnapshot

BIN_PX = 2  # a bin is a 2x2 square: one lit bin stays visible and can be pointed at


# Per-block kinds counted in one pass: a block adds one to its bin's row of this many counters.
_FREE, _USED, _RESERVED, _CACHED, _KINDS = range(5)
_KIND_OF_STATE = np.zeros(256, dtype=np.int64)
_KIND_OF_STATE[BlockState.USED] = _USED
_KIND_OF_STATE[BlockState.RESERVED] = _RESERVED
_KIND_OF_STATE[BlockState.CACHED] = _CACHED


@dataclass(frozen=True)
class BinGrid:
    num_blocks: int
    blocks_per_bin: int
    cols: int  # bins per row
    rows: int
    bin_px: int = BIN_PX

    @property
    def num_bins(self) -> int:
        return -(-self.num_blocks // self.blocks_per_bin)

    def block_range(self, index: int) -> tuple[int, int]:
        """[start, stop) of the blocks in bin `index`."""
        start = index * self.blocks_per_bin
        return start, min(start + self.blocks_per_bin, self.num_blocks)

    def bin_at(self, x: float, y: float) -> int:
        """The bin at bin-grid coordinates x, y (one unit per bin); -1 outside the pool."""
        if not (np.isfinite(x) and np.isfinite(y)):
            return -1
        col, row = int(np.floor(x)), int(np.floor(y))
        if not (0 <= col < self.cols and 0 <= row < self.rows):
            return -1
        index = row * self.cols + col
        return index if index < self.num_bins else -1

    def bin_of(self, block: int) -> int:
        return block // self.blocks_per_bin

    @cached_property
    def bin_of_block(self) -> np.ndarray:
        """int64 (num_blocks,): each block's bin, kept while the grid lives (one per layout)."""
        return np.arange(self.num_blocks, dtype=np.int64) // self.blocks_per_bin

    @cached_property
    def code_base(self) -> np.ndarray:
        """Each block's first counter in count_bins's (bin, kind) bincount."""
        return self.bin_of_block * _KINDS

    @cached_property
    def starts(self) -> np.ndarray:
        """Each bin's first block, for the reduceats over blocks."""
        return np.arange(0, self.num_blocks, self.blocks_per_bin)


def bin_grid(num_blocks: int, width_px: int, height_px: int, bin_px: int = BIN_PX) -> BinGrid:
    """The fewest blocks per bin that fit the pool into width x height pixels; rows beyond what
    the pool needs are not used (the caller gives the height back)."""
    cols = max(1, width_px // bin_px)
    room = cols * max(1, height_px // bin_px)
    per_bin = max(1, -(-num_blocks // room))
    bins = -(-num_blocks // per_bin)
    cols = min(cols, bins)
    return BinGrid(num_blocks, per_bin, cols, -(-bins // cols), bin_px)


@dataclass(frozen=True)
class BinCounts:
    """Per bin (arrays of length num_bins)."""

    blocks: np.ndarray  # blocks in the bin (the last bin may hold fewer)
    used: np.ndarray
    reserved: np.ndarray
    cached: np.ndarray
    shared: np.ndarray  # used blocks with ref count > 1
    selected: np.ndarray  # blocks of the selected sequences
    dominant: np.ndarray  # owner row (raster.owner_rows) holding most held blocks; -1 if none
    dominant_count: np.ndarray

    @property
    def held(self) -> np.ndarray:
        return self.used + self.reserved


def _dominant(rows: np.ndarray, grid: BinGrid) -> tuple[np.ndarray, np.ndarray]:
    """Most frequent non-negative value of `rows` (per block, -1: not held) in each bin, and
    its count.

    Most bins hold one owner (min == max): only the mixed ones are sorted, and their mode is
    the longest run of equal values in the sorted bin."""
    k, starts = grid.blocks_per_bin, grid.starts
    held = rows >= 0
    top = np.maximum.reduceat(rows, starts)
    low = np.minimum.reduceat(np.where(held, rows, np.iinfo(rows.dtype).max), starts)
    count = np.add.reduceat(held.astype(np.int32), starts)
    dominant = np.where(count > 0, top, -1)
    mixed = np.flatnonzero((count > 0) & (low != top))
    if mixed.size:
        padded = np.concatenate([rows, np.full(grid.num_bins * k - len(rows), -1, rows.dtype)])
        values = np.sort(padded.reshape(grid.num_bins, k)[mixed], axis=1).ravel()
        # Runs of equal values in the flattened sorted bins (a bin's first block starts one);
        # each run's key packs its length over its value, so the largest key per bin names the
        # longest run and its value in one reduceat.
        position = np.arange(len(values))
        run_starts = np.flatnonzero(
            (position % k == 0) | np.concatenate([[True], values[1:] != values[:-1]])
        )
        run_values = values[run_starts].astype(np.int64)
        run_lengths = np.diff(np.append(run_starts, len(values)))
        span = int(run_values.max()) + 1
        keys = np.where(run_values >= 0, run_lengths * span + run_values, 0)
        first_run = np.searchsorted(run_starts, np.arange(len(mixed)) * k)
        best = np.maximum.reduceat(keys, first_run)
        dominant[mixed] = best % span
        count[mixed] = best // span
    return dominant, count


def count_bins(
    snapshot: KVSnapshot, grid: BinGrid, palette: raster.OwnerColors, selected: np.ndarray | None
) -> BinCounts:
    """One bincount over (bin, kind) codes gives the states; the sparse ones (shared,
    selected) count only their own blocks."""
    bin_index = grid.bin_of_block
    kind = _KIND_OF_STATE[snapshot.state]
    by_kind = np.bincount(grid.code_base + kind, minlength=grid.num_bins * _KINDS)
    by_kind = by_kind.reshape(grid.num_bins, _KINDS)
    held = (kind == _USED) | (kind == _RESERVED)
    rows = raster.owner_rows(snapshot.owner, palette.ids, palette.unknown, palette.free)
    dominant, dominant_count = _dominant(np.where(held, rows, -1).astype(np.int32), grid)
    shared = np.flatnonzero((kind == _USED) & (snapshot.ref_count > 1))
    chosen = np.flatnonzero(selected) if selected is not None else np.zeros(0, np.int64)
    return BinCounts(
        blocks=by_kind.sum(axis=1),
        used=by_kind[:, _USED],
        reserved=by_kind[:, _RESERVED],
        cached=by_kind[:, _CACHED],
        shared=np.bincount(bin_index[shared], minlength=grid.num_bins),
        selected=np.bincount(bin_index[chosen], minlength=grid.num_bins),
        dominant=dominant,
        dominant_count=dominant_count,
    )
