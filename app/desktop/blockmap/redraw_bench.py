"""The block map's redraw time at pool sizes from a desktop card's to a 70B deployment's.

Times what a telemetry tick costs one map: `set_snapshot` (bins, overview and lens images, or
the cell image of a small pool) plus the QImage conversion the next paint does, in the real
BlockMapView, offscreen. Two pool kinds per size: "realistic" (sample_pools: a few chats in
scattered runs, ~1% cached, mostly free) and "busy" (every block held or cached, owners drawn
at random from 400 sequences: every bin mixed, the binning's worst case). Two snapshots take
turns so nothing is reused between ticks.

`python -m kvscope.app.desktop.blockmap.redraw_bench` prints the figures as JSON;
`run_map_redraw_bench()` returns them.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time

import numpy as np

from kvscope.app.desktop.blockmap.sample_pools import BLOCK_SIZE, pool_snapshot, realistic_pool
from kvscope.engine.kv.snapshot import BlockState, KVSnapshot, SequenceInfo

POOL_SIZES = (64, 1_456, 10_922, 200_000)
# One map's area in the window at 1400 x 860 and at 1024 x 700 (both maps side by side).
VIEW_SIZES = ((689, 345), (501, 242))
FRAME_BUDGET_MS = 16.0


def busy_pool(num_blocks: int, num_seqs: int = 400, seed: int = 0) -> KVSnapshot:
    """Every block held (70%, a fifth of them shared) or cached, owners at random."""
    rng = np.random.default_rng(seed)
    n = num_blocks
    state = np.where(rng.random(n) < 0.7, BlockState.USED, BlockState.CACHED).astype(np.uint8)
    used = state == BlockState.USED
    owner = np.where(used, rng.integers(1, num_seqs + 1, n), -1).astype(np.int64)
    ref = np.where(used, rng.choice([1, 1, 1, 1, 2], n), 0).astype(np.int32)
    filled = np.where(used, rng.integers(1, BLOCK_SIZE + 1, n), BLOCK_SIZE).astype(np.int32)
    infos = tuple(
        SequenceInfo(i, f"load-{i % 40}/{i}", 0, "running", 100, 120, 120, 0, ())
        for i in range(1, num_seqs + 1)
    )
    return pool_snapshot("paged", state, owner, ref, filled, infos)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _time_view(view, snapshots: list[KVSnapshot], repeats: int) -> dict:
    view.set_snapshot(snapshots[0])
    wall, build = [], []
    for i in range(repeats):
        start = time.perf_counter()
        view.set_snapshot(snapshots[i % len(snapshots)])
        view.image.render()  # the QImage conversions the next paint would do
        if view.binned:
            view.overview_image.render()
        wall.append((time.perf_counter() - start) * 1e3)
        build.append(view.last_build_ms)
    return {
        "mode": "overview + lens" if view.binned else "one cell per block",
        "blocks_per_dot": view.layout_plan.grid.blocks_per_bin if view.layout_plan.grid else 1,
        "median_ms": round(statistics.median(wall), 2),
        "p90_ms": round(sorted(wall)[math.ceil(0.9 * len(wall)) - 1], 2),
        "build_median_ms": round(statistics.median(build), 2),
    }


def run_map_redraw_bench(
    pool_sizes: tuple[int, ...] = POOL_SIZES,
    view_sizes: tuple[tuple[int, int], ...] = VIEW_SIZES,
    repeats: int = 21,
) -> dict:
    """Redraw figures per pool size, pool kind and view size (ms, wall clock)."""
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])
    from kvscope.app.desktop.blockmap.block_map import BlockMapView

    runs = []
    for width, height in view_sizes:
        view = BlockMapView()
        view.resize(width, height)
        view.show()
        app.processEvents()
        for blocks in pool_sizes:
            for kind, make in (("realistic", realistic_pool), ("busy", busy_pool)):
                snapshots = [make(blocks, seed=0), make(blocks, seed=1)]
                figures = _time_view(view, snapshots, repeats)
                runs.append({"view_px": [width, height], "blocks": blocks, "pool": kind, **figures})
                app.processEvents()
        view.hide()  # not close(): pyqtgraph's close() crashes a shown view
        view.deleteLater()
        app.processEvents()
    worst = max(r["median_ms"] for r in runs)
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "frame_budget_ms": FRAME_BUDGET_MS,
        "worst_median_ms": worst,
        "within_budget": worst <= FRAME_BUDGET_MS,
        "runs": runs,
    }


def main() -> None:
    print(json.dumps(run_map_redraw_bench(), indent=2))


if __name__ == "__main__":
    main()
