"""BlockMapPanel: the paged pool and the naive contiguous allocator side by side, with legends,
a metrics strip and rolling plots. The window feeds it snapshots ~10 times a second.

Selection: clicking a block selects its owning sequence, clicking a legend chip selects that
group's live sequences; the selected block tables stay lit on both maps, everything else dims.
Selection is kept by request id, so it follows the same request across both allocators.
Every term in the captions and the key has a tooltip (glossary.py); a banner says when the
naive allocator cannot hold two sequences at these settings (app/desktop/blockmap/pool_fit.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QVBoxLayout, QWidget

from kvscope.app.core.request_ids import group_of
from kvscope.app.desktop.blockmap import colors
from kvscope.app.desktop.blockmap.block_map import BlockMapView
from kvscope.app.desktop.blockmap.caption_label import CaptionLabel
from kvscope.app.desktop.blockmap.captions import paged_caption, selection_caption, shadow_caption
from kvscope.app.desktop.blockmap.glossary import explain
from kvscope.app.desktop.blockmap.legend import GroupLegend, StateKey
from kvscope.app.desktop.blockmap.maps_over_plots import MAP_MIN_PX, MapsOverPlots
from kvscope.app.desktop.blockmap.metrics_strip import MetricsStrip, held_share, useful_share
from kvscope.app.desktop.blockmap.pool_fit import naive_warning
from kvscope.app.desktop.blockmap.time_plots import TimePlots
from kvscope.app.desktop.blockmap.tooltip import describe_block
from kvscope.app.desktop.blockmap.traffic import TrafficCounter, read_memory
from kvscope.app.desktop.palette import DARK, Palette, current
from kvscope.app.desktop.theme import follow_theme
from kvscope.engine.kv.snapshot import BlockState, KVSnapshot, SequenceInfo


def panel_style(p: Palette) -> str:
    """The panel's own sheet (it wins over the application's), in a theme's colours."""
    return (
        f"#blockMapPanel {{ background: {p.ground}; }}"
        f" QLabel {{ color: {p.text}; }}"
        f" QSplitter::handle {{ background: {p.handle}; }}"
        f" QScrollBar:vertical {{ background: {p.scroll}; width: 8px; margin: 0; }}"
        f" QScrollBar::handle:vertical {{ background: {p.scroll_handle}; border-radius: 4px;"
        " min-height: 16px; }"
        " QScrollBar::add-line:vertical, QScrollBar::sub-line:vertical { height: 0; }"
    )


def caption_style(p: Palette) -> str:
    return f"color: {p.text}; font-size: 11px;"


def banner_style(p: Palette) -> str:
    background, text, border = p.banner
    return (
        f"background: {background}; color: {text}; border: 1px solid {border};"
        " border-radius: 4px; padding: 4px 8px; font-size: 11px;"
    )


# The dark theme's, for the replay window (app/desktop/recording/replay_view.py), which stays dark.
PANEL_STYLE = panel_style(DARK)
CAPTION_STYLE = caption_style(DARK)
BANNER_STYLE = banner_style(DARK)
INFO_RETRY_S = 0.5  # re-ask for a hovered block's tokens at most this often while it changes
# What a click selects: a request group (a legend chip) or one sequence, as (request id, its
# sample index).
Selection = tuple[Literal["group"], str] | tuple[Literal["seq"], tuple[str, int]]


class _MapFrame(QWidget):
    """A caption over a block map (or over a note when there is nothing to show)."""

    def __init__(self, placeholder: str, terms: tuple[str, ...]) -> None:
        super().__init__()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(3)
        self.caption = CaptionLabel(placeholder)  # as tall as its wrapped lines, 3 at least
        self.caption.setToolTip(explain(*terms))
        self.map = BlockMapView()
        self.map.setMinimumHeight(MAP_MIN_PX)
        layout.addWidget(self.caption)
        layout.addWidget(self.map, 1)


class BlockMapPanel(QWidget):
    sequence_selected = Signal(int)  # paged seq id of the new selection; -1 when cleared
    block_hovered = Signal(int)  # physical block of the paged pool under the pointer; -1: none

    def __init__(self, parent: QWidget | None = None, clock: Callable[[], float] = time.monotonic):
        super().__init__(parent)
        self.setObjectName("blockMapPanel")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self._clock = clock
        self.paged: KVSnapshot | None = None
        self.shadow: KVSnapshot | None = None
        self.stats: dict = {}
        self.labels: dict[str, str] = {}
        self.counter = TrafficCounter()
        self._selection: Selection | None = None
        self._info_provider: Callable[[int], None] | None = None
        self._hover: tuple[BlockMapView, int] | None = None
        self._info: tuple[int, dict] | None = None  # latest provider answer (block, info)
        self._asked: tuple[int, tuple, float] | None = None  # block, its content key, when

        self.strip = MetricsStrip()
        self.paged_frame = _MapFrame(
            "Paged pool: waiting for the engine…", ("held", "useful slots", "shared", "cached")
        )
        self.shadow_frame = _MapFrame(
            "Naive contiguous allocator: no shadow snapshot yet",
            ("same traffic", "held", "useful slots", "reserved", "holes"),
        )
        self.banner = QLabel(wordWrap=True)
        self.banner.setObjectName("naiveWarning")
        self.banner.setVisible(False)
        self.paged_map = self.paged_frame.map
        self.shadow_map = self.shadow_frame.map
        self.legend = GroupLegend()
        self.key = StateKey()
        self.plots = TimePlots()

        maps = QWidget()
        maps_row = QHBoxLayout(maps)
        maps_row.setContentsMargins(0, 0, 0, 0)
        maps_row.setSpacing(10)
        maps_row.addWidget(self.paged_frame, 1)
        maps_row.addWidget(self.shadow_frame, 1)
        top = QWidget()
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(0, 0, 0, 0)
        top_layout.addWidget(maps, 1)
        # Chips above the key, each the full width: side by side they overlapped under 1600 px.
        top_layout.addWidget(self.legend)
        top_layout.addWidget(self.key)
        splitter = MapsOverPlots(top, self.plots)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.banner)
        layout.addWidget(self.strip)
        layout.addWidget(splitter, 1)

        for view in (self.paged_map, self.shadow_map):
            view.block_clicked.connect(lambda block, v=view: self._on_block_clicked(v, block))
            view.block_hovered.connect(lambda block, v=view: self._on_block_hovered(v, block))
        self.legend.group_clicked.connect(self._on_group_clicked)
        follow_theme(self, self._restyle)

    def _restyle(self, palette: Palette) -> None:
        """A theme's colours: the sheets, the maps' ground, the maps drawn again."""
        self.setStyleSheet(panel_style(palette))
        self.banner.setStyleSheet(banner_style(palette))
        for frame in (self.paged_frame, self.shadow_frame):
            frame.caption.setStyleSheet(caption_style(palette))
            frame.map.setBackground(colors.active().background_hex)
        if self.paged is not None:
            self._draw_maps()

    # ---- the window's API ------------------------------------------------------------------
    def update_view(
        self,
        paged: KVSnapshot,
        shadow: KVSnapshot | None,
        stats: dict,
        device_memory: dict | None,
    ) -> None:
        now = self._clock()
        self.counter.update(now, paged, stats)
        memory = read_memory(device_memory)
        changed = paged is not self.paged or shadow is not self.shadow
        self.paged, self.shadow, self.stats = paged, shadow, stats or {}
        self._update_banner()
        if changed:
            self._draw_maps()
            self._refresh_hover()
        self.strip.update_view(
            paged,
            shadow,
            self.stats,
            memory,
            self.counter.tokens_per_s,
            self.counter.recent_prefix_hit_rate,
            self.counter.rate_window,
        )
        pm, sm = paged.metrics, shadow.metrics if shadow is not None else None
        self.plots.add_sample(
            now,
            {
                "paged_held": 100 * held_share(pm),
                "naive_held": 100 * held_share(sm) if sm is not None else None,
                "paged_useful": 100 * useful_share(pm),
                "naive_useful": 100 * useful_share(sm) if sm is not None else None,
                "running": self.stats.get("num_running", pm.num_running),
                "waiting": self.stats.get("num_waiting", pm.num_waiting),
                "preempted": pm.num_preempted,
                "naive_waiting": sm.num_waiting if sm is not None else None,
                "tokens_per_s": self.counter.tokens_per_s,
                "prefix_hit": 100 * self.counter.recent_prefix_hit_rate,
                "mem_used": memory.used_gib,
                "mem_process": memory.process_gib,
            },
        )

    def _update_banner(self) -> None:
        """Warn when the naive allocator holds fewer than two full-length sequences."""
        stats = self.stats
        keys = ("kv_blocks_total", "kv_block_size", "max_model_len")
        warning = ""
        if all(isinstance(stats.get(k), int) for k in keys):
            warning = naive_warning(*(stats[k] for k in keys))
        if warning != self.banner.text():
            self.banner.setText(warning)
            self.banner.setVisible(bool(warning))

    def set_group_labels(self, labels: dict[str, str]) -> None:
        self.labels = dict(labels)
        for view in (self.paged_map, self.shadow_map):
            view.labels = self.labels  # the overview's bin cards name groups by their labels
        self._update_legend()

    def set_block_info_provider(self, fn: Callable[[int], None] | None) -> None:
        """fn(block_id) asks for a block's tokens; the answer comes via show_block_info()."""
        self._info_provider = fn

    def show_block_info(self, block_id: int, info: dict) -> None:
        self._info = (block_id, info)
        self._refresh_hover()

    def select_sequence(self, seq_id: int) -> None:
        """Select a paged sequence by id (-1 clears), as a click on one of its blocks would."""
        seq = self.paged.sequence(seq_id) if self.paged is not None else None
        self._select(("seq", (seq.request_id, seq.index)) if seq else None)

    def clear_selection(self) -> None:
        self._select(None)

    # ---- selection -------------------------------------------------------------------------
    def _matches(self, s: SequenceInfo) -> bool:
        if self._selection is None:
            return False
        kind, value = self._selection
        if kind == "group":
            return group_of(s.request_id) == value
        return (s.request_id, s.index) == value

    def selected_seq_ids(self, snapshot: KVSnapshot | None) -> set[int]:
        if snapshot is None or self._selection is None:
            return set()
        return {s.seq_id for s in snapshot.sequences if self._matches(s)}

    def _select(self, selection: Selection | None) -> None:
        self._selection = selection
        self.paged_map.set_selected(self.selected_seq_ids(self.paged))
        self.shadow_map.set_selected(self.selected_seq_ids(self.shadow))
        self._update_legend()
        self._update_paged_caption()
        ids = sorted(self.selected_seq_ids(self.paged))
        self.sequence_selected.emit(ids[0] if ids else -1)

    def _on_block_clicked(self, view: BlockMapView, block: int) -> None:
        snapshot = view.snapshot
        seq = None
        if snapshot is not None and block >= 0:
            state = snapshot.state[block]
            if state in (BlockState.USED, BlockState.RESERVED):
                seq = snapshot.sequence(int(snapshot.owner[block]))
        if seq is None or (self._selection and self._matches(seq)):
            self._select(None)  # clicking free space or the selection again clears it
        else:
            self._select(("seq", (seq.request_id, seq.index)))

    def _on_group_clicked(self, group: str) -> None:
        self._select(None if self._selection == ("group", group) else ("group", group))

    # ---- drawing ---------------------------------------------------------------------------
    def _draw_maps(self) -> None:
        paged, shadow = self.paged, self.shadow
        self.paged_map.set_snapshot(paged, self.selected_seq_ids(paged))
        self._update_paged_caption()
        # Without a shadow (turned off in the engine) the paged map takes the whole width.
        self.shadow_frame.setVisible(shadow is not None)
        self.shadow_map.set_snapshot(shadow, self.selected_seq_ids(shadow))
        if shadow is not None:
            self.shadow_frame.caption.setText(shadow_caption(shadow))
        if self._selection is not None and not self.selected_seq_ids(paged) | (
            self.selected_seq_ids(shadow)
        ):
            self._select(None)  # the selected request has finished
        self._update_legend()

    def _update_paged_caption(self) -> None:
        if self.paged is None:
            return
        text = paged_caption(self.paged)
        if self.shadow is None:
            text += f" · <span style='color:{current().faint}'>naive allocator view off</span>"
        selection = self._selection
        if selection is not None:
            if selection[0] == "group":
                name = selection[1]
            else:
                request_id, index = selection[1]
                name = request_id + (f" #{index}" if index else "")
            text += selection_caption(self.paged, self.selected_seq_ids(self.paged), name)
        self.paged_frame.caption.setText(text)

    def _update_legend(self) -> None:
        live = {
            group_of(s.request_id)
            for snapshot in (self.paged, self.shadow)
            if snapshot is not None
            for s in snapshot.sequences
            if s.status != "finished"
        }
        blocks: dict[str, set[int]] = {}
        for s in self.paged.sequences if self.paged is not None else ():
            blocks.setdefault(group_of(s.request_id), set()).update(s.block_table)
        ref = self.paged.ref_count if self.paged is not None else None
        entries = []
        for group in sorted(live, key=_natural_key):
            label = self.labels.get(group)
            name = f"{group} · {label}" if label else group
            held = blocks.get(group, set())
            shared = sum(int(ref[b]) > 1 for b in held) if ref is not None else 0
            more = f", {shared} shared" if shared else ""
            entries.append((group, f"{name}  ({len(held)} blocks{more})"))
        selected = self._selection[1] if self._selection and self._selection[0] == "group" else None
        self.legend.set_groups(entries, selected)

    # ---- hover -----------------------------------------------------------------------------
    def _on_block_hovered(self, view: BlockMapView, block: int) -> None:
        self._hover = (view, block) if block >= 0 else None
        if view is self.paged_map:
            self.block_hovered.emit(block)
        self._refresh_hover()

    def _refresh_hover(self) -> None:
        if self._hover is None:
            return
        view, block = self._hover
        snapshot = view.snapshot
        if snapshot is None or block >= snapshot.num_blocks:
            view.hide_hover()
            return
        is_paged = view is self.paged_map
        info = None
        if is_paged:
            self._maybe_ask(snapshot, block)
            if self._info is not None and self._info[0] == block:
                info = self._info[1]
        html = describe_block(snapshot, block, self.labels, info, holds_tokens=is_paged)
        view.show_hover(html)

    def _maybe_ask(self, snapshot: KVSnapshot, block: int) -> None:
        """Ask the provider for the block's tokens when it is new under the pointer or its
        content changed (throttled): the answer arrives later through show_block_info."""
        if self._info_provider is None:
            return
        state = int(snapshot.state[block])
        if state not in (BlockState.USED, BlockState.CACHED):
            return
        content = (state, int(snapshot.owner[block]), int(snapshot.filled[block]))
        now = self._clock()
        if self._asked is not None and self._asked[0] == block:
            if self._asked[1] == content or now - self._asked[2] < INFO_RETRY_S:
                return
        else:
            self._info = None
        self._asked = (block, content, now)
        self._info_provider(block)

    def hover_text(self) -> str:
        """The hover card's current rich text ('' when hidden)."""
        for view in (self.paged_map, self.shadow_map):
            if not view.hover_label.isHidden():
                return view.hover_label.text()
        return ""


def _natural_key(group: str) -> tuple:
    """Sort "load-10" after "load-9"."""
    stem = group.rstrip("0123456789")
    number = group[len(stem) :]
    return (stem, int(number) if number else -1, group)
