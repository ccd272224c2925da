"""MapColumn: the block map over the collapsible load-generator pane, in a vertical splitter.

Opened, the load generator takes the height its form wants where that leaves the map its
minimum, and scrolls otherwise; the block map's panel keeps its maps readable and drops rows of
plots first (app/desktop/blockmap/maps_over_plots.py).
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFrame,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.desktop.blockmap import BlockMapPanel
from kvscope.app.desktop.simulated_users.panel import LoadGeneratorPanel

MAP_MIN_WIDTH = 520  # the block map's state key is about this wide
LOADGEN_MIN_HEIGHT = 72  # two rows of the load generator's form; the rest scrolls
UNLIMITED = 16_777_215  # Qt's QWIDGETSIZE_MAX, which PySide6 does not export


class MapColumn(QSplitter):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(Qt.Orientation.Vertical, parent, childrenCollapsible=False)
        self.setObjectName("mapColumn")
        self.blockmap = BlockMapPanel()
        # Its metrics strip asks for ever more width as numbers grow; the window keeps its
        # size and the panel gets what the splitter gives it.
        self.blockmap.setMinimumWidth(MAP_MIN_WIDTH)
        self.loadgen_panel = LoadGeneratorPanel()
        self.loadgen_toggle = QToolButton()
        self.loadgen_toggle.setText("Simulated users (load generator)")
        self.loadgen_toggle.setCheckable(True)
        self.loadgen_toggle.setObjectName("sectionToggle")
        self.loadgen_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.loadgen_toggle.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.loadgen_toggle.toggled.connect(self._toggle_loadgen)
        self.loadgen_scroll = QScrollArea(widgetResizable=True)
        self.loadgen_scroll.setObjectName("loadgenScroll")
        self.loadgen_scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.loadgen_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.loadgen_scroll.setMinimumHeight(LOADGEN_MIN_HEIGHT)
        self.loadgen_scroll.setWidget(self.loadgen_panel)
        self.loadgen_section = QWidget()
        self.loadgen_section.setObjectName("loadgenSection")
        section_layout = QVBoxLayout(self.loadgen_section)
        section_layout.setContentsMargins(0, 0, 0, 0)
        section_layout.setSpacing(0)
        section_layout.addWidget(self.loadgen_toggle)
        section_layout.addWidget(self.loadgen_scroll)
        self.addWidget(self.blockmap)
        self.addWidget(self.loadgen_section)
        self.setStretchFactor(0, 1)
        self._toggle_loadgen(False)

    def _toggle_loadgen(self, shown: bool) -> None:
        self.loadgen_scroll.setVisible(shown)
        self.loadgen_toggle.setArrowType(
            Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow
        )
        header = self.loadgen_toggle.sizeHint().height()
        self.loadgen_section.setMaximumHeight(UNLIMITED if shown else header)
        self.handle(1).setEnabled(shown)
        total = sum(self.sizes())
        height = header
        if shown:  # the whole form if it fits beside the map's minimum, else what does
            room = total - self.blockmap.minimumSizeHint().height()
            wanted = header + self.loadgen_panel.sizeHint().height()
            height = max(min(wanted, room), header + LOADGEN_MIN_HEIGHT)
        self.setSizes([total - height, height])
