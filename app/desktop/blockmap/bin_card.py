"""What the hover card says about one bin of the overview (rich text): its block range, its
blocks by state, and the sequences holding most of them (by first owner, as the map colours a
shared block). Only the hovered bin's blocks are read."""

from __future__ import annotations

from html import escape

import numpy as np

from kvscope.app.core.request_ids import group_of
from kvscope.app.desktop.blockmap import colors
from kvscope.app.desktop.palette import current
from kvscope.engine.kv.snapshot import BlockState, KVSnapshot

MAX_OWNERS = 4


def describe_bin(
    snapshot: KVSnapshot, start: int, stop: int, labels: dict[str, str] | None = None
) -> str:
    labels = labels or {}
    aside = current().card_aside
    state = snapshot.state[start:stop]
    counts = {
        "in use": int((state == BlockState.USED).sum()),
        "reserved": int((state == BlockState.RESERVED).sum()),
        "cached": int((state == BlockState.CACHED).sum()),
        "free": int((state == BlockState.FREE).sum()),
    }
    span = f"Blocks {start:,}–{stop - 1:,}" if stop - start > 1 else f"Block {start:,}"
    lines = [
        f"<b>{span}</b> &nbsp;<span style='color:{aside}'>{escape(snapshot.allocator)} pool,"
        f" {stop - start:,} blocks in this pixel</span>",
        " · ".join(f"{n:,} {name}" for name, n in counts.items() if n or name == "free"),
    ]
    shared = int(((state == BlockState.USED) & (snapshot.ref_count[start:stop] > 1)).sum())
    if shared:
        lines.append(f"{shared:,} shared (ref count &gt; 1)")
    held = (state == BlockState.USED) | (state == BlockState.RESERVED)
    owners, held_counts = np.unique(snapshot.owner[start:stop][held], return_counts=True)
    order = np.argsort(-held_counts, kind="stable")
    for i in order[:MAX_OWNERS]:
        seq = snapshot.sequence(int(owners[i]))
        name = escape(seq.request_id) if seq else f"seq {int(owners[i])}"
        label = labels.get(group_of(seq.request_id)) if seq else None
        if label:
            name += f" — {escape(label)}"
        swatch = colors.group_hex(group_of(seq.request_id)) if seq else current().faint
        lines.append(
            f"<span style='color:{swatch}'>■</span> {name}"
            f" <span style='color:{aside}'>({int(held_counts[i]):,} blocks)</span>"
        )
    if len(owners) > MAX_OWNERS:
        lines.append(f"… and {len(owners) - MAX_OWNERS} more sequences")
    lines.append(f"<i style='color:{aside}'>click to look here in the lens below</i>")
    return "<br>".join(lines)
