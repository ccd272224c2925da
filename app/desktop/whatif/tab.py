"""WhatIfTab: the What-if panel as a closable tab beside "This engine", and its wiring.

Engine ▸ What if… opens it (and asks the worker for the engine's trace: `EngineClient.take_trace`,
answered by `trace_ready` on the GUI thread); closing it cancels its simulations and drops the
panel, so the window without it is as before (the map tabs' bar hides with one tab). Apply goes
through the window's own `apply_settings`, as the settings dialog's does. The window is passed
in, not imported: the window imports this module.
"""

from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QTabBar, QToolButton

from kvscope.app.desktop.whatif.panel import WhatIfPanel
from kvscope.app.desktop.window_menu import add_engine_actions

TAB_TITLE = "What if"


class WhatIfTab(QObject):
    def __init__(self, window) -> None:
        super().__init__(window)
        self.window = window
        self.panel: WhatIfPanel | None = None
        self.action = QAction("What if…", window)
        self.action.setToolTip("Replay this engine's own traffic under other settings")
        self.action.triggered.connect(self.open)
        add_engine_actions(window, [self.action])
        window.client.trace_ready.connect(self._on_trace)

    def open(self) -> WhatIfPanel:
        """Show the tab (made on first use) and take a fresh trace."""
        tabs = self.window.map_tabs
        if self.panel is None:
            # Its simulations wait while the engine works (they would slow every step of it).
            idle = self.window.client.engine_idle
            self.panel = WhatIfPanel(lambda: self.window.settings, engine_idle=idle)
            self.panel.apply_requested.connect(self.window.apply_settings)
            self.panel.refresh_requested.connect(self.window.client.take_trace)
            index = tabs.addTab(self.panel, TAB_TITLE)
            close = QToolButton(autoRaise=True)
            close.setObjectName("whatifClose")
            close.setText("✕")
            close.setToolTip("Close the What-if tab")
            close.clicked.connect(self.close)
            tabs.tabBar().setTabButton(index, QTabBar.ButtonPosition.RightSide, close)
        tabs.setCurrentWidget(self.panel)
        self.window.client.take_trace()
        return self.panel

    def close(self) -> None:
        panel, self.panel = self.panel, None
        if panel is None:
            return
        panel.shutdown()
        tabs = self.window.map_tabs
        tabs.removeTab(tabs.indexOf(panel))
        panel.deleteLater()

    def _on_trace(self, trace) -> None:
        if self.panel is not None:
            self.panel.set_trace(trace)
