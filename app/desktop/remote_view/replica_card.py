"""ReplicaCard: one replica's row: its colour and name, its status line (status_line.py) and
its /metrics tiles (metric_tiles.py), in the block map's tile style."""

from __future__ import annotations

from html import escape

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.desktop.blockmap.metrics_strip import tile_style
from kvscope.app.desktop.palette import DARK, Palette
from kvscope.app.desktop.remote_view.metric_tiles import TILES, tile_texts
from kvscope.app.desktop.remote_view.status_line import SEVERITY_HEX, StatusLine
from kvscope.app.desktop.theme import follow_theme


def card_style(p: Palette) -> str:
    """The block map's tiles, and the replica's name, in a theme's colours."""
    return tile_style(p) + (
        f" QLabel#replicaName {{ color: {p.strong}; font-size: 12px; font-weight: bold; }}"
        " QLabel#replicaStatus { font-size: 11px; }"
    )


CARD_STYLE = card_style(DARK)


class _Tile(QFrame):
    def __init__(self, caption: str, tip: str) -> None:
        super().__init__()
        self.setObjectName("tile")
        self.tip = tip
        self.setToolTip(tip)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 3, 8, 4)
        layout.setSpacing(0)
        self.caption = QLabel(caption)
        self.caption.setObjectName("caption")
        self.value = QLabel("–")
        self.value.setObjectName("value")
        self.detail = QLabel("")
        self.detail.setObjectName("detail")
        for w in (self.caption, self.value, self.detail):
            # Clipped rather than widening the row: seven tiles share a 1024 px window.
            w.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
            w.setMinimumWidth(1)
            layout.addWidget(w)


class ReplicaCard(QWidget):
    def __init__(
        self, replica: str, color: str, columns: int = len(TILES), parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.replica = replica
        follow_theme(self, lambda palette: self.setStyleSheet(card_style(palette)))
        self.swatch = QLabel()
        self.swatch.setFixedSize(12, 12)
        self.swatch.setStyleSheet(f"background: {color}; border-radius: 2px;")
        self.name = QLabel(escape(replica))
        self.name.setObjectName("replicaName")
        # Its own row under the name and the button, wrapped: a long error is never cut off.
        self.status = QLabel("connecting", wordWrap=True)
        self.status.setObjectName("replicaStatus")
        self.status.setTextFormat(Qt.TextFormat.RichText)
        self.status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.status.setMinimumWidth(1)
        head = QHBoxLayout()
        head.setContentsMargins(0, 0, 0, 0)
        head.setSpacing(6)
        head.addWidget(self.swatch)
        head.addWidget(self.name)
        head.addStretch(1)
        self.disconnect_button = QToolButton()
        self.disconnect_button.setText("Disconnect")
        self.disconnect_button.setObjectName("disconnectReplica")
        self.disconnect_button.setToolTip(f"Stop following {replica} (Engine ▸ Connect… adds it)")
        self.disconnect_button.setStyleSheet("padding: 0 6px; font-size: 10px;")
        head.addWidget(self.disconnect_button)
        self.grid = grid = QGridLayout()
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setSpacing(5)
        self.tiles: dict[str, _Tile] = {key: _Tile(caption, tip) for key, caption, tip in TILES}
        self.columns = 0
        self.set_columns(columns, details=columns == len(TILES))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 2, 0, 2)
        layout.setSpacing(3)
        layout.addLayout(head)
        layout.addWidget(self.status)
        layout.addLayout(grid)
        layout.addStretch(1)  # spare height below the tiles, not around the status line
        self.line: StatusLine | None = None

    def set_columns(self, columns: int, details: bool = True) -> None:
        """Tiles in rows of `columns` (seven in one row when wide); without `details` the
        tiles' second lines move into their tooltips, so two rows stay short."""
        for tile in self.tiles.values():
            tile.detail.setVisible(details)
        if columns == self.columns:
            return
        for tile in self.tiles.values():
            self.grid.removeWidget(tile)
        for i, tile in enumerate(self.tiles.values()):
            self.grid.addWidget(tile, i // columns, i % columns)
        for c in range(max(columns, self.columns)):
            self.grid.setColumnStretch(c, 1 if c < columns else 0)
        self.columns = columns

    def set_status(self, line: StatusLine, extra: str = "", note: str = "") -> None:
        """The status line, `extra` (model, blocks) after it, `note` (how block hashes are
        matched) in the tooltip only."""
        self.line = line
        color = SEVERITY_HEX[line.severity]
        details = " · ".join(escape(d) for d in line.details)
        text = f"<b style='color:{color}'>{escape(line.state)}</b>"
        if details:
            text += f" <span style='color:#A9B0BD'>· {details}</span>"
        if extra:
            text += f" <span style='color:#7A8290'>· {escape(extra)}</span>"
        self.status.setText(text)
        tip = line.text + (f" · {extra}" if extra else "")
        tip += "".join(f"\n{t}" for t in line.technical)
        self.status.setToolTip(tip + (f"\nBlock hashes: {note}" if note else ""))

    def set_metrics(self, metrics, history: list) -> None:
        for key, (value, detail) in tile_texts(metrics, history).items():
            tile = self.tiles[key]
            if tile.value.text() != value:
                tile.value.setText(value)
            if tile.detail.text() != detail:
                tile.detail.setText(detail)
                tile.detail.setToolTip(detail)
                tile.setToolTip(f"{tile.tip}<br><b>{escape(detail)}</b>")

    def status_text(self) -> str:
        return self.line.text if self.line is not None else ""

    def tiles_text(self) -> str:
        return "\n".join(
            f"{t.caption.text()}: {t.value.text()} ({t.detail.text()})" for t in self.tiles.values()
        )
