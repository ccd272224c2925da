"""How a model's KV groups read on the map: sliding-window groups apart from full ones.

A model whose layers differ (Gemma 3: 5 sliding to 1 full; Mistral: all sliding) keeps one block
table per KV group (engine.kv.layout). A sliding group's blocks go back to the pool as the window
moves on, so while a long reply streams its count stays flat and the released count climbs."""

from __future__ import annotations

from kvscope.engine.kv.snapshot import KVSnapshot


def has_windows(s: KVSnapshot) -> bool:
    return any(w is not None for w in s.group_windows)


def group_name(s: KVSnapshot, group: int) -> str:
    """ "full attention" or "sliding, 512-token window", with the group's number when the
    model has several."""
    window = s.group_windows[group] if 0 <= group < len(s.group_windows) else None
    kind = "full attention" if window is None else f"sliding, {window:,}-token window"
    return f"KV group {group} ({kind})" if len(s.group_windows) > 1 else kind


def groups_text(s: KVSnapshot) -> str:
    """Blocks held by full and by sliding groups, and how many windows gave back: "" for a
    model without sliding layers."""
    if not has_windows(s):
        return ""
    used = s.metrics.group_blocks_used or (0,) * len(s.group_windows)
    full = sum(n for n, w in zip(used, s.group_windows, strict=False) if w is None)
    sliding = sum(n for n, w in zip(used, s.group_windows, strict=False) if w is not None)
    windows = sorted({w for w in s.group_windows if w is not None})
    label = "/".join(f"{w:,}" for w in windows)
    parts = []
    if None in s.group_windows:
        parts.append(f"{full:,} full-attention")
    parts.append(f"{sliding:,} sliding ({label}-token window)")
    return (
        f"{' + '.join(parts)} blocks held · {s.metrics.blocks_released:,} released as windows slid"
    )
