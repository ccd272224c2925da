"""RemoteView: what the connected servers' KV caches hold, beside the local block map.

It owns one ReplicaMonitor (app/remote/monitor.py: threads, no Qt) per connection of the
window's ConnectionList, started and stopped as the list changes, and reads their snapshots
from a QTimer (4 Hz) on the GUI thread; every network wait happens in the monitors' threads or
the routing box's pool, so nothing here blocks. What it draws, top to bottom:

- what is known remotely and what is not (no pool grid: a server does not say where a block
  sits in its pool);
- a card per replica in its colour: status line (live / silent / reconnecting / down,
  restarts, malformed frames, replayed and lost seqs) and its /metrics tiles;
- the merged prefix tree (merged_tree.py, prefix_tree.py; merged off the GUI thread by
  tree_merging.py) and the selected run's text;
- rolling plots of blocks held and KV usage per replica, and the routing box; under
  WIDE_FROM_PX (the map column of a 1024 px window) tree, plots and routing become tabs.

Redraws are keyed on what changed: the tree on the caches' versions, tiles on the metrics
objects, plots at most twice a second."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QFrame,
    QLabel,
    QScrollArea,
    QSplitter,
    QStackedWidget,
    QTabWidget,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.desktop.remote_view.held_plot import (
    HeldPlots,
    rate_series,
    scrape_series,
    step_series,
)
from kvscope.app.desktop.remote_view.merged_tree import TreeRun
from kvscope.app.desktop.remote_view.metric_tiles import TILES
from kvscope.app.desktop.remote_view.prefix_tree import Detokenizer, PrefixTreeView
from kvscope.app.desktop.remote_view.replica_card import ReplicaCard
from kvscope.app.desktop.remote_view.replica_colors import ReplicaColors
from kvscope.app.desktop.remote_view.routing_box import RoutingBox, Tokenize
from kvscope.app.desktop.remote_view.run_texts import RunTexts
from kvscope.app.desktop.remote_view.status_line import BAD, StatusLine, status_line
from kvscope.app.desktop.remote_view.tree_merging import TreeMerger, tree_caption
from kvscope.app.desktop.remote_view.view_style import style_view
from kvscope.app.remote.connection import Connection
from kvscope.app.remote.connections_qt import ConnectionList

if TYPE_CHECKING:  # the monitor module loads only when the first connection needs one
    from kvscope.app.remote.monitor import ReplicaMonitor, ReplicaSnapshot

POLL_MS = 250
MAX_CARDS_SHOWN = 2
WIDE_FROM_PX = 760  # narrower (the map column of a 1024 px window): tabs, tiles in two rows
NARROW_TILE_COLUMNS = 4
PLOT_REDRAW_S = 0.5
KNOWN_CAPTION = (
    "<span style='color:#8C94A3'>Known remotely:</span> block hashes, parent links, token ids,"
    " counts (KV events), /metrics. <span style='color:#8C94A3'>Not known:</span> physical"
    " block positions, reference counts: no pool grid for a remote server."
)
NO_SERVER = (
    "No server connected. Engine ▸ Connect…, or start with"
    " <code>kvscope --connect http://host:8000 --kv-events tcp://host:5557</code>."
)


class Monitor(Protocol):
    """What the view asks of a ReplicaMonitor (app/remote/monitor.py); tests pass fakes."""

    connection: Connection

    def snapshot(self) -> ReplicaSnapshot: ...

    def stop(self) -> None: ...


# A factory so tests can feed the view without sockets: Connection -> a started monitor.
MonitorFactory = Callable[[Connection], Monitor]


def _default_monitor(connection: Connection) -> ReplicaMonitor:
    from kvscope.app.remote.monitor import ReplicaMonitor

    monitor = ReplicaMonitor(connection)
    monitor.start()
    return monitor


log = logging.getLogger(__name__)
_logged: set[tuple[str, str]] = set()


def _log_once(label: str, where: str) -> None:
    """A replica's failure, with its traceback, once per replica and place: the view polls at
    4 Hz, and a log that repeats the same trace every tick helps nobody."""
    if (label, where) not in _logged:
        _logged.add((label, where))
        log.exception("remote view: replica %s failed in %s; the others go on", label, where)


def _usage_pct(m) -> float | None:
    return None if m.kv_cache_usage is None else 100 * m.kv_cache_usage


def _queued(m) -> float | None:
    if m.running is None and m.waiting is None:
        return None
    return (m.running or 0) + (m.waiting or 0)


def _stop_in_background(monitor: Monitor) -> None:
    """A monitor's stop() joins its threads (up to a couple of seconds): not on the GUI."""
    threading.Thread(target=monitor.stop, name="kvscope-monitor-stop", daemon=True).start()


class RemoteView(QWidget):
    def __init__(
        self,
        connections: ConnectionList,
        parent: QWidget | None = None,
        monitor_factory: MonitorFactory | None = None,
        tokenize: Tokenize | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("remoteView")
        style_view(self)  # its own sheet, in the theme's colours
        self.connections = connections
        self._monitor_factory = monitor_factory or _default_monitor
        self._clock = clock
        self.monitors: dict[str, Monitor] = {}
        self._last_good: dict[
            str, ReplicaSnapshot
        ] = {}  # each replica's last snapshot that was read
        self.snapshots: list = []
        self.colors = ReplicaColors()
        self.cards: dict[str, ReplicaCard] = {}
        self.roots: list[TreeRun] = []
        self._closed = False  # after shutdown(): no monitors, pools or redraws any more
        self.merger = TreeMerger(self)  # merges the caches' trees off the GUI thread
        self.merger.merged.connect(self._show_tree)
        self._metrics_seen: dict[str, object] = {}
        self._plotted_at = -1e18
        self._plotted_replicas: set[str] = set()

        self.known = QLabel(KNOWN_CAPTION, wordWrap=True)
        self.known.setObjectName("remoteKnown")
        self.known.setStyleSheet("font-size: 11px;")
        self.empty = QLabel(NO_SERVER, wordWrap=True)
        self.empty.setObjectName("remoteEmpty")
        self.cards_box = QWidget()
        self.cards_layout = QVBoxLayout(self.cards_box)
        self.cards_layout.setContentsMargins(0, 0, 0, 0)
        self.cards_layout.setSpacing(4)
        # Two cards show; more scroll, so the tree keeps its height with many replicas.
        self.cards_scroll = QScrollArea(widgetResizable=True)
        self.cards_scroll.setObjectName("replicaCards")
        self.cards_scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.cards_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.cards_scroll.setWidget(self.cards_box)
        self.tree_caption = QLabel("Prefix tree: no blocks yet")
        self.tree_caption.setObjectName("treeCaption")
        self.tree_caption.setTextFormat(Qt.TextFormat.RichText)
        self.tree_caption.setStyleSheet("font-size: 11px;")
        self.tree_caption.setWordWrap(True)  # the view may be as narrow as the map column
        self.tree = PrefixTreeView(self.colors.color)
        self.detail = QTextBrowser()
        self.detail.setObjectName("runDetail")
        self.detail.setPlaceholderText("Select a branch to read the blocks it holds.")
        self.texts = RunTexts(self.tree, self.detail, lambda: self.snapshots, self)
        self.tree.run_selected.connect(self.texts.show_run)
        self.plots = HeldPlots()
        self.routing = RoutingBox(tokenize)
        self.routing.replicas = self._routing_replicas
        self.routing.predict = self._predict
        self.routing.color_of = self.colors.color

        self.tree_column = QSplitter(Qt.Orientation.Vertical, childrenCollapsible=False)
        tree_top = QWidget()
        tree_layout = QVBoxLayout(tree_top)
        tree_layout.setContentsMargins(0, 0, 0, 0)
        tree_layout.setSpacing(3)
        tree_layout.addWidget(self.tree_caption)
        tree_layout.addWidget(self.tree, 1)
        self.tree_column.addWidget(tree_top)
        self.tree_column.addWidget(self.detail)
        self.tree_column.setStretchFactor(0, 4)
        self.tree_column.setStretchFactor(1, 1)
        self.tree_column.setSizes([400, 90])
        # Wide: the tree beside the plots over the routing box. Narrow (the map column of a
        # 1024 px window): the three as tabs, each the full width.
        self.side = QSplitter(Qt.Orientation.Vertical, childrenCollapsible=False)
        self.body = QSplitter(Qt.Orientation.Horizontal, childrenCollapsible=False)
        self.body.addWidget(self.tree_column)
        self.body.addWidget(self.side)
        self.body.setStretchFactor(0, 3)
        self.body.setStretchFactor(1, 2)
        self.tabs = QTabWidget()
        self.tabs.setObjectName("remoteTabs")
        self.tabs.setDocumentMode(True)
        self.pages = QStackedWidget()
        self.pages.addWidget(self.body)
        self.pages.addWidget(self.tabs)
        self.narrow: bool | None = None
        self._apply_width(WIDE_FROM_PX)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.setSpacing(5)
        layout.addWidget(self.known)
        layout.addWidget(self.empty)
        layout.addWidget(self.cards_scroll)
        layout.addWidget(self.pages, 1)

        self.timer = QTimer(self, interval=POLL_MS)
        self.timer.timeout.connect(self.poll)
        connections.changed.connect(self.sync_monitors)
        self.sync_monitors()
        self.timer.start()

    # ---- monitors ------------------------------------------------------------------------
    def sync_monitors(self) -> None:
        """Start a monitor for every new connection, stop those of removed (or changed) ones."""
        if self._closed:
            return
        wanted = {c.label: c for c in self.connections}
        for label, monitor in list(self.monitors.items()):
            if label not in wanted or monitor.connection != wanted[label]:
                _stop_in_background(self.monitors.pop(label))
        for label, connection in wanted.items():
            if label not in self.monitors:
                self.monitors[label] = self._monitor_factory(connection)
        self.poll()

    def poll(self) -> None:
        """The timer's tick: read every monitor's snapshot (cheap: copies under a lock)."""
        if not self.isVisible() and self.snapshots:
            return  # a hidden tab redraws when shown (showEvent)
        snapshots: list[ReplicaSnapshot] = []
        for label, monitor in self.monitors.items():
            snapshot: ReplicaSnapshot | None
            try:
                snapshot = monitor.snapshot()
            except Exception:  # one replica's trouble stays on its card (its last good view)
                _log_once(label, "snapshot")
                snapshot = self._last_good.get(label)
            if snapshot is not None:
                self._last_good[label] = snapshot
                snapshots.append(snapshot)
        self.set_snapshots(snapshots)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._apply_width(event.size().width())

    def _apply_width(self, width: int) -> None:
        """Lay the body out for the width: side by side from WIDE_FROM_PX, else as tabs;
        tiles in one row of seven when wide, two rows of four when narrow."""
        narrow = width < WIDE_FROM_PX
        if narrow == self.narrow:
            return
        self.narrow = narrow
        if narrow:
            self.tabs.addTab(self.tree_column, "Prefix tree")
            self.tabs.addTab(self.plots, "Over time")
            self.tabs.addTab(self.routing, "Routing")
            self.pages.setCurrentWidget(self.tabs)
        else:
            while self.tabs.count():
                self.tabs.removeTab(0)
            self.body.insertWidget(0, self.tree_column)
            self.side.addWidget(self.plots)
            self.side.addWidget(self.routing)
            self.side.setSizes([260, 200])
            self.body.setSizes([600, 400])
            self.pages.setCurrentWidget(self.body)
        for card in self.cards.values():
            card.set_columns(self._tile_columns(), details=not narrow)
        self._fit_cards()

    def _tile_columns(self) -> int:
        return NARROW_TILE_COLUMNS if self.narrow else len(TILES)

    def _fit_cards(self) -> None:
        """Up to MAX_CARDS_SHOWN cards in view; more scroll."""
        self.cards_scroll.setVisible(bool(self.cards))
        if not self.cards:
            return
        shown = next(iter(self.cards.values()))
        per_card = shown.sizeHint().height() + self.cards_layout.spacing()
        self.cards_scroll.setFixedHeight(min(len(self.cards), MAX_CARDS_SHOWN) * per_card)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        self.poll()

    def shutdown(self) -> None:
        """Stop the timer, the monitors (in the background) and the worker pools. The window
        calls it when it closes (a tab gets no closeEvent of its own)."""
        self._closed = True
        self.timer.stop()
        for monitor in self.monitors.values():
            _stop_in_background(monitor)
        self.monitors.clear()
        self.routing.shutdown()
        self.merger.close()
        self.texts.shutdown()

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self.shutdown()
        super().closeEvent(event)

    def tree_settled(self) -> bool:
        """Whether the tree shows the latest snapshots' caches (it is merged in a worker)."""
        return self.merger.settled()

    def _show_tree(self, roots: list[TreeRun], caches: list) -> None:
        self.roots = roots
        self.tree.set_roots(roots)
        self.texts.decode_previews()
        self.tree_caption.setText(
            tree_caption(roots, caches, self.colors.color, self.tree.rows_left_out)
        )

    # ---- drawing -------------------------------------------------------------------------
    def set_detokenizer(self, fn: Detokenizer | None) -> None:
        """fn(token_ids) -> text: the tree and its detail show text instead of token ids."""
        self.tree.set_detokenizer(fn)

    def set_snapshots(self, snapshots: list) -> None:
        now = self._clock()
        self.snapshots = list(snapshots)
        labels = [s.connection.label for s in snapshots]
        self.empty.setVisible(not snapshots)
        self._sync_cards(labels)
        for s in snapshots:
            label = s.connection.label
            card = self.cards[label]
            try:
                card.set_status(status_line(s, now), self._card_extra(s), s.hash_note)
                if self._metrics_seen.get(label) is not s.metrics or s.metrics is None:
                    self._metrics_seen[label] = s.metrics
                    card.set_metrics(s.metrics, s.metrics_history)
            except Exception as e:  # a value we did not foresee: this card says so, others go on
                _log_once(label, "card")
                trouble = StatusLine("cannot show", BAD, (f"{type(e).__name__} in its data",))
                card.set_status(trouble)
        self.merger.update(self.snapshots)
        plotted = set(labels) != self._plotted_replicas
        if plotted or now - self._plotted_at >= PLOT_REDRAW_S or now < self._plotted_at:
            self._update_plots(now)

    def _card_extra(self, s) -> str:
        parts = []
        if s.model:
            parts.append(s.model)
        parts.append(f"{s.cache.num_blocks:,} blocks cached")
        if s.block_size:
            parts.append(f"{s.block_size} tokens/block")
        return " · ".join(parts)

    def _sync_cards(self, labels: list[str]) -> None:
        for label in list(self.cards):
            if label not in labels:
                card = self.cards.pop(label)
                self.cards_layout.removeWidget(card)
                card.deleteLater()
                self.plots.drop(label)
                self._metrics_seen.pop(label, None)
        for label in labels:
            if label not in self.cards:
                card = ReplicaCard(label, self.colors.color(label), self._tile_columns())
                card.disconnect_button.clicked.connect(
                    lambda _checked=False, lb=label: self.connections.remove(lb)
                )
                self.cards[label] = card
                self.cards_layout.addWidget(card)
        self._fit_cards()

    def _update_plots(self, now: float) -> None:
        self._plotted_at = now
        self._plotted_replicas = {s.connection.label for s in self.snapshots}
        for s in self.snapshots:
            label = s.connection.label
            color = self.colors.color(label)
            t, v = step_series(s.cache.history, now)
            self.plots.set_series("held", label, color, t, v)
            history = s.metrics_history
            usage = scrape_series(history, now, _usage_pct)
            self.plots.set_series("usage", label, color, *usage)
            self.plots.set_series("queue", label, color, *scrape_series(history, now, _queued))
            rate = rate_series(history, now, lambda m: m.generation_tokens_total)
            self.plots.set_series("rate", label, color, *rate)
        self.plots.rescale()

    # ---- routing -------------------------------------------------------------------------
    def _routing_replicas(self) -> dict[str, tuple[Connection, str | None]]:
        return {s.connection.label: (s.connection, s.model) for s in self.snapshots}

    def _predict(self, prompt_token_ids: dict[str, list[int]]) -> list:
        from kvscope.app.remote.routing import predict_hits

        live = {s.connection.label: s for s in self.snapshots}
        caches = {label: s.cache for label, s in live.items()}
        hashers = {label: s.hasher for label, s in live.items()}
        sizes = {label: s.block_size for label, s in live.items()}
        ids = {label: tokens for label, tokens in prompt_token_ids.items() if label in caches}
        return predict_hits(ids, caches, hashers, sizes)

    # ---- for tests and logs --------------------------------------------------------------
    def status_text(self, replica: str) -> str:
        return self.cards[replica].status_text()
