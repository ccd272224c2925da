"""The block map: the engine's physical KV block pool drawn live, next to the naive allocator."""

from kvscope.app.desktop.blockmap.panel import BlockMapPanel

__all__ = ["BlockMapPanel"]
