"""One colour per replica, from the block map's palette, kept for the session.

Replicas get palette colours in the order they are first seen (not by a hash of their label),
so two replicas never share a colour, and a replica keeps its colour while others come and go."""

from __future__ import annotations

from kvscope.app.desktop.blockmap.colors import PALETTE_HEX


class ReplicaColors:
    def __init__(self) -> None:
        self._assigned: dict[str, str] = {}

    def color(self, replica: str) -> str:
        """The replica's "#RRGGBB"; a new replica takes the first colour no one holds."""
        if replica not in self._assigned:
            taken = set(self._assigned.values())
            free = [c for c in PALETTE_HEX if c not in taken]
            self._assigned[replica] = (
                free[0] if free else PALETTE_HEX[len(self._assigned) % len(PALETTE_HEX)]
            )
        return self._assigned[replica]
