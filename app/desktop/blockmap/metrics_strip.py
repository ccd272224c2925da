"""MetricsStrip: a grid of tiles with the pool's headline numbers, paged next to naive."""

from __future__ import annotations

import math

from PySide6.QtCore import Qt
from PySide6.QtGui import QTextDocumentFragment
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from kvscope.app.desktop.blockmap import colors
from kvscope.app.desktop.blockmap.glossary import explain
from kvscope.app.desktop.blockmap.traffic import Memory
from kvscope.app.desktop.palette import DARK, Palette, current
from kvscope.app.desktop.theme import follow_theme
from kvscope.engine.kv.snapshot import KVSnapshot, PoolMetrics


def tile_style(p: Palette) -> str:
    return (
        f"QFrame#tile {{ background: {p.surface}; border: 1px solid {p.border};"
        " border-radius: 5px; }"
        " QLabel { background: transparent; border: none; }"
        f" QLabel#caption {{ color: {p.muted}; font-size: 10px; font-weight: bold; }}"
        f" QLabel#value {{ color: {p.strong}; font-size: 16px; font-weight: bold; }}"
        f" QLabel#detail {{ color: {p.detail}; font-size: 10px; }}"
    )


TILE_STYLE = tile_style(DARK)  # the dark theme's
TILES = (
    (
        "held",
        "KV HELD",
        "<p>Share of the pool's blocks held (used + reserved).</p>" + explain("held"),
    ),
    ("useful", "USEFUL SLOTS", explain("useful slots")),
    (
        "seqs",
        "SEQUENCES",
        "<p>The engine: running · waiting · preempted (waiting again).</p>" + explain("preempted"),
    ),
    (
        "rate",
        "TOKENS / S",
        "Generated tokens per second, from snapshots, over at least 3 s and at least 4 steps.",
    ),
    ("prefix", "PREFIX HITS", "Prompt tokens served from the prefix cache, since start."),
    ("memory", "MEMORY", "Device memory (NVML), or the process's RSS on a CPU-only machine."),
)


def held_share(m: PoolMetrics) -> float:
    """Fraction of the pool's blocks held (used + reserved)."""
    return (m.blocks_used + m.blocks_reserved) / m.blocks_total if m.blocks_total else 0.0


def useful_share(m: PoolMetrics) -> float:
    """Share of held slots holding K/V; NaN when nothing is held (no share to speak of)."""
    return m.useful_slot_share if m.slots_held else math.nan


def allocator_name(s: KVSnapshot) -> str:
    """The allocator a snapshot's pool runs: "paged", "contiguous" or the "naive" shadow."""
    return "naive" if s.allocator == "contiguous-shadow" else s.allocator


def _pct(x: float) -> str:
    return "—" if math.isnan(x) else f"{100 * x:.0f}%"


def _count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e4 else f"{n}"


def versus(paged: str, naive: str | None) -> str:
    """Rich text: the paged value, then the naive one in their series colours."""
    theme = colors.active()
    text = f"<span style='color:{theme.paged_hex}'>{paged}</span>"
    if naive is not None:
        text += f" <span style='color:{current().faint}; font-size:11px'>vs</span> "
        text += f"<span style='color:{theme.naive_hex}'>{naive}</span>"
    return text


class _Tile(QFrame):
    def __init__(self, caption: str, tip: str) -> None:
        super().__init__()
        self.setObjectName("tile")
        self.setToolTip(tip)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 5, 10, 6)
        layout.setSpacing(1)
        self.caption = QLabel(caption)
        self.caption.setObjectName("caption")
        self.value = QLabel("–")
        self.value.setObjectName("value")
        self.value.setTextFormat(Qt.TextFormat.RichText)
        self.detail = QLabel("")
        self.detail.setObjectName("detail")
        for w in (self.caption, self.value, self.detail):
            # Long texts are clipped rather than widening the tile: the map column is narrow.
            w.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
            w.setMinimumWidth(1)
            layout.addWidget(w)


class MetricsStrip(QWidget):
    def __init__(self, parent: QWidget | None = None, columns: int = 3) -> None:
        super().__init__(parent)
        layout = QGridLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        self.tiles: dict[str, _Tile] = {}
        for i, (key, caption, tip) in enumerate(TILES):
            self.tiles[key] = _Tile(caption, tip)
            layout.addWidget(self.tiles[key], i // columns, i % columns)
        for c in range(columns):
            layout.setColumnStretch(c, 1)
        follow_theme(self, lambda palette: self.setStyleSheet(tile_style(palette)))

    def update_view(
        self,
        paged: KVSnapshot,
        shadow: KVSnapshot | None,
        stats: dict,
        memory: Memory,
        tokens_per_s: float,
        recent_prefix_hit_rate: float,
        rate_window_s: float = 3.0,
    ) -> None:
        pm = paged.metrics
        sm = shadow.metrics if shadow is not None else None
        t = self.tiles
        name = allocator_name(paged)
        t["held"].value.setText(
            versus(_pct(held_share(pm)), _pct(held_share(sm)) if sm is not None else None)
        )
        # Reserved blocks are held too: the status bar's count (llm.stats()) includes them.
        held = pm.blocks_used + pm.blocks_reserved
        detail = f"{held:,} of {pm.blocks_total:,} blocks ({name})"
        if pm.blocks_reserved:
            detail += f", {pm.blocks_reserved:,} reserved empty"
        t["held"].detail.setText(detail)
        t["useful"].value.setText(
            versus(_pct(useful_share(pm)), _pct(useful_share(sm)) if sm is not None else None)
        )
        waste = f"{name} wastes {pm.internal_waste_slots:,} slots"
        if sm is not None:
            waste += f", naive {sm.internal_waste_slots:,}"
        t["useful"].detail.setText(
            waste if pm.slots_held or (sm and sm.slots_held) else "nothing held"
        )
        running = stats.get("num_running", pm.num_running)
        waiting = stats.get("num_waiting", pm.num_waiting)
        t["seqs"].value.setText(f"{running} · {waiting} · {pm.num_preempted}")
        naive = f", naive: {sm.num_waiting} waiting" if sm is not None else ""
        t["seqs"].detail.setText(f"run · wait · preempted{naive}")
        t["rate"].value.setText(f"{tokens_per_s:,.1f}")
        t["rate"].detail.setText(
            f"over {rate_window_s:.0f} s · step {stats.get('num_steps', paged.step):,}"
        )
        hits = stats.get("prefix_cache_hit_tokens", pm.prefix_hit_tokens)
        queries = stats.get("prefix_cache_query_tokens", pm.prefix_query_tokens)
        t["prefix"].value.setText(_pct(hits / queries if queries else math.nan))
        recent = (
            "" if math.isnan(recent_prefix_hit_rate) else f" · 10 s: {_pct(recent_prefix_hit_rate)}"
        )
        t["prefix"].detail.setText(f"{_count(hits)} of {_count(queries)} tokens{recent}")
        t["memory"].value.setText(memory.headline)
        t["memory"].detail.setText(memory.detail)
        t["memory"].setToolTip(memory.tooltip)

    def text(self) -> str:
        """All tiles as plain text (captions, values, details), for tests and logs."""
        parts = []
        for tile in self.tiles.values():
            value = QTextDocumentFragment.fromHtml(tile.value.text()).toPlainText()
            parts.append(f"{tile.caption.text()}: {value} ({tile.detail.text()})")
        return "\n".join(parts)
