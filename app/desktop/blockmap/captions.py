"""The captions over the two maps: one line of figures each, and the selection's line.

Every figure is as true as its words: "useful —" when nothing is held, holes counted only
between held blocks (an empty pool has none), the engine's own allocator named.
"""

from __future__ import annotations

import numpy as np

from kvscope.app.desktop.blockmap import colors
from kvscope.app.desktop.blockmap.kv_groups import groups_text
from kvscope.app.desktop.blockmap.metrics_strip import held_share, useful_share
from kvscope.app.desktop.palette import current
from kvscope.engine.kv.snapshot import BlockState, KVSnapshot


def _pct(x: float) -> str:
    return "—" if np.isnan(x) else f"{100 * x:.0f}%"


def num_holes(state: np.ndarray) -> int:
    """Runs of free (or cached) blocks with a held block on each side: true holes, not the
    free tail or head of the pool. An empty pool has none."""
    held = (state == BlockState.USED) | (state == BlockState.RESERVED)
    if not held.any():
        return 0
    inner = ~held[np.argmax(held) : len(held) - np.argmax(held[::-1])]
    return int(np.count_nonzero(np.diff(inner.astype(np.int8)) == 1))


def _holes_text(s: KVSnapshot) -> str:
    m = s.metrics
    if m.blocks_free == m.blocks_total:
        return f"all {m.blocks_total:,} blocks free, no holes"
    holes = num_holes(s.state)
    named = "no holes" if not holes else "1 hole" if holes == 1 else f"{holes:,} holes"
    return f"largest free run {m.largest_free_run:,} of {m.blocks_free:,} free ({named})"


def paged_caption(s: KVSnapshot) -> str:
    m = s.metrics
    # The engine itself may run the naive allocator (allocator="contiguous").
    name = "Paged pool" if s.allocator == "paged" else "Contiguous pool (engine)"
    groups = groups_text(s)
    return (
        f"<b style='color:{colors.active().paged_hex}'>{name}</b> · {s.num_blocks:,} blocks ×"
        f" {s.block_size} slots · held {_pct(held_share(m))} · useful"
        f" {_pct(useful_share(m))} · {m.blocks_shared:,} shared · {m.blocks_cached:,} cached"
        f" · {m.num_waiting} waiting" + (f"<br>{groups}" if groups else "")
    )


def selection_caption(s: KVSnapshot, seq_ids: set[int], name: str) -> str:
    """One line about the selected sequences: how many blocks they hold, how many shared."""
    tables = [q.block_table for q in s.sequences if q.seq_id in seq_ids]
    blocks = {b for t in tables for b in t}
    shared = sum(int(s.ref_count[b]) > 1 for b in blocks)
    seqs = f"{len(tables)} sequences" if len(tables) != 1 else "1 sequence"
    palette = current()
    return (
        f"<br><span style='color:{palette.strong}'>Selected <b>{name}</b>: {seqs},"
        f" {len(blocks)} blocks ({shared} shared)</span>"
        f" <span style='color:{palette.faint}'>· click it again to clear</span>"
    )


def shadow_caption(s: KVSnapshot) -> str:
    m = s.metrics
    return (
        f"<b style='color:{colors.active().naive_hex}'>Naive contiguous</b>, same traffic ·"
        f" held {_pct(held_share(m))} · useful {_pct(useful_share(m))} ·"
        f" {m.blocks_reserved:,} reserved empty · <b>{m.num_waiting} waiting</b>"
        f" ({m.num_would_wait} run in paged) · {_holes_text(s)}"
    )
