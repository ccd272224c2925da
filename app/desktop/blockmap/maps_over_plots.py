"""MapsOverPlots: the maps (with their key) over the rolling plots, in a vertical splitter that
gives way in the maps' favour.

The plots keep two readable rows while the maps still get MAP_ROOMY_PX above them; below that
they keep one row (TimePlots shows the rows that fit), and the maps never go under their least
height. At 1024x700 with the load panel open the plots used to keep both rows and crush each
map to a ~40 px strip.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QSplitter, QWidget

from kvscope.app.desktop.blockmap.time_plots import ROW_MIN_PX, TimePlots

MAP_MIN_PX = 120  # the overview and four lens rows of a binned pool (map_geometry.py)
MAP_ROOMY_PX = 200  # a map this tall reads at a glance; below it the plots give a row up


class MapsOverPlots(QSplitter):
    def __init__(self, maps: QWidget, plots: TimePlots) -> None:
        super().__init__(Qt.Orientation.Vertical, childrenCollapsible=False)
        self.maps, self.plots = maps, plots
        self.addWidget(maps)
        self.addWidget(plots)
        self.setStretchFactor(0, 3)
        self.setStretchFactor(1, 2)
        self.setSizes([600, 330])
        self._keep_rows(plots.rows)

    def _keep_rows(self, rows: int) -> None:
        self.plots.setMinimumHeight(rows * ROW_MIN_PX + self.plots.chrome_px())

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        # The maps' least height holds MAP_MIN_PX per map; what they get beyond it decides
        # whether the plots may keep every row.
        roomy = self.maps.minimumSizeHint().height() + MAP_ROOMY_PX - MAP_MIN_PX
        every_row = self.plots.rows * ROW_MIN_PX + self.plots.chrome_px()
        self._keep_rows(self.plots.rows if event.size().height() >= roomy + every_row else 1)
        super().resizeEvent(event)
