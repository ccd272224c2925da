"""The What-if tab: this engine's own traffic replayed under other settings (engine.whatif),
recorded and what-if side by side on block maps, plots over time, figures and sweeps."""

from kvscope.app.desktop.whatif.panel import WhatIfPanel
from kvscope.app.desktop.whatif.tab import WhatIfTab

__all__ = ["WhatIfPanel", "WhatIfTab"]
