"""A pool too large for one readable cell per block, folded into bins: `blocks_per_bin`
consecutive blocks per bin, the bins laid out row by row, `cols` per row, each drawn as a
square of `bin_px` screen pixels. What each bin holds is counted with numpy only (no Python
loop per block or per bin): blocks by state, shared and selected blocks, and the sequence that
holds at least half of its held blocks, if one does (by first owner, as the cell map colours a
shared block).
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
    # Owner row (raster.owner_rows) holding at least half the held blocks; -1 if none does.
    dominant: np.ndarray
    dominant_count: np.ndarray  # its held blocks (0 if none)

    @property
    def held(self) -> np.ndarray:
        return self.used + self.reserved


def _majority(
    rows: np.ndarray, grid: BinGrid, held_count: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The value of `rows` (per block, -1: not held) found in at least half of each bin's held
    blocks (`held_count` of them), -1 where none is, and its count.

    Most bins hold one owner (min == max). In a sorted bin, a value holding half of the held
    entries covers the held part's middle position or the one after it, so only those two
    candidates are counted, and only in the bins that hold several owners."""
    k, starts = grid.blocks_per_bin, grid.starts
    held = rows >= 0
    top = np.maximum.reduceat(rows, starts)
    low = np.minimum.reduceat(np.where(held, rows, np.iinfo(rows.dtype).max), starts)
    majority = np.where(held_count > 0, top, -1)
    count = held_count.copy()
    mixed = np.flatnonzero((held_count > 0) & (low != top))
    if mixed.size:
        padded = np.concatenate([rows, np.full(grid.num_bins * k - len(rows), -1, rows.dtype)])
        values = np.sort(padded.reshape(grid.num_bins, k)[mixed], axis=1)
        h = held_count[mixed]
        picked = np.arange(len(mixed))
        best_value = np.full(len(mixed), -1, dtype=rows.dtype)
        best_count = np.zeros(len(mixed), dtype=np.int32)
        for middle in (k - h + (h - 1) // 2, k - h + h // 2):  # the unheld -1s sort first
            candidate = values[picked, middle]
            found = (values == candidate[:, None]).sum(axis=1, dtype=np.int32)
            better = found > best_count
            best_value = np.where(better, candidate, best_value)
            best_count = np.maximum(found, best_count)
        enough = 2 * best_count >= h
        majority[mixed] = np.where(enough, best_value, -1)
        count[mixed] = np.where(enough, best_count, 0)
    return majority, count


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
    held_rows = np.where(held, rows, -1).astype(np.int32)
    dominant, dominant_count = _majority(held_rows, grid, by_kind[:, _USED] + by_kind[:, _RESERVED])
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
