"""Where the detail lens looks: a window of whole rows of the pool at readable cell size.

The lens follows the selected sequence's blocks when there is a selection, else the busiest
region (held blocks count fully, cached ones a quarter). It stays put while its window holds
nearly as much as the busiest one (STAY_SHARE), so it does not jump on every snapshot.
"""

from __future__ import annotations

import numpy as np

from kvscope.engine.kv.snapshot import BlockState, KVSnapshot

LENS_CELL_PX = 10  # 9 px cells with a 1 px gap: fill bars, rings and hatches read
CACHED_WEIGHT = 0.25
STAY_SHARE = 0.8


_WEIGHT_OF_STATE = np.zeros(256, dtype=np.float32)
_WEIGHT_OF_STATE[[BlockState.USED, BlockState.RESERVED]] = 1.0
_WEIGHT_OF_STATE[BlockState.CACHED] = CACHED_WEIGHT


def activity(snapshot: KVSnapshot) -> np.ndarray:
    """Per block: how much the lens wants to show it."""
    return _WEIGHT_OF_STATE[snapshot.state]


def busiest_row(
    weights: np.ndarray, cols: int, visible_rows: int, current: int | None = None
) -> int:
    """First row of the `visible_rows`-row window holding the most weight (rows of `cols`
    blocks); `current` when its window holds at least STAY_SHARE of the best."""
    rows = -(-len(weights) // cols)
    padded = np.zeros(rows * cols, dtype=np.float64)
    padded[: len(weights)] = weights
    per_row = padded.reshape(rows, cols).sum(axis=1)
    visible = max(1, min(visible_rows, rows))
    sums = np.concatenate([[0.0], np.cumsum(per_row)])
    window = sums[visible:] - sums[:-visible]  # window[r]: rows r .. r + visible - 1
    last_start = rows - visible
    if current is not None and 0 <= current <= last_start:
        if window[current] >= STAY_SHARE * window.max():
            return current
    best = window.max()
    if best <= 0:
        return 0 if current is None else min(max(current, 0), last_start)
    # Windows that tie hold the same region: take the middle one, so the region sits in the
    # middle of the lens rather than on its bottom row.
    ties = window >= best
    first = int(np.argmax(ties))
    run = int(np.argmin(ties[first:])) if not ties[first:].all() else len(ties) - first
    return first + (run - 1) // 2


def clamp_row(row: int, total_rows: int, visible_rows: int) -> int:
    return int(min(max(row, 0), max(total_rows - visible_rows, 0)))


def captions(
    start: int, stop: int, follow: bool, selection: bool, per_dot: int, faint: str
) -> list[tuple[str, str]]:
    """The lens's one-line caption, as (rich text, plain text), longest first: which blocks it
    shows, why there, and the overview's scale; a narrow map takes the first that fits."""
    if follow:
        why, short = (
            ("following the selection", "selection")
            if selection
            else (
                "following the busiest region",
                "busiest",
            )
        )
    else:
        why, short = "pinned (double-click: follow)", "pinned"
    blocks = f"Lens: blocks {start:,}–{max(stop - 1, start):,}"
    dots = f"overview: {per_dot:,} blocks per dot" if per_dot > 1 else "overview: 1 block per dot"
    return [
        (
            f"{blocks} · {why} <span style='color:{faint}'>· {dots}</span>",
            f"{blocks} · {why} · {dots}",
        ),
        (f"{blocks} · {why}", f"{blocks} · {why}"),
        (f"{blocks} · {short}", f"{blocks} · {short}"),
        (blocks, blocks),
    ]
