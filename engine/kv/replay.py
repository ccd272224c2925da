"""Replay a recorded session's KV events into the snapshots the live engine produced.

A session file is data from anywhere: its header is checked before anything is sized by it, and
an event that does not follow from the ones before it is a ValueError, not a crash.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

from engine.kv.events import StepProgress, read_events
from engine.kv.shadow import ContiguousShadow
from engine.kv.snapshot import BlockState, KVSnapshot
from engine.kv.telemetry import PoolCounters, PoolTelemetry

# Far above any real pool (a 141 GiB GPU holds ~10^7 blocks of the smallest models).
MAX_REPLAY_BLOCKS = 1 << 26
ALLOCATORS = ("paged", "contiguous")
MAX_REPLAY_GROUPS = 256  # KV groups: a model has at most as many as layers


def replay_events(
    path: str | Path, with_shadow: bool = False
) -> Iterator[tuple[KVSnapshot, KVSnapshot | None]]:
    """Yield (pool, contiguous shadow or None) after every engine step in the file."""
    header, events = read_events(path)
    num_blocks, block_size = header.get("num_blocks"), header.get("block_size")
    # A header is data: check it before sizing arrays by it (a crafted one asked for 931 GiB).
    for key, value, high in (
        ("num_blocks", num_blocks, MAX_REPLAY_BLOCKS),
        ("block_size", block_size, 1024),
    ):
        if not _is_count(value) or not 1 <= value <= high:
            raise ValueError(f"{path}: header {key} {value!r} is not in [1, {high:,}]")
    allocator = header.get("allocator")
    if allocator not in ALLOCATORS:
        raise ValueError(f"{path}: header allocator {allocator!r} is not one of {ALLOCATORS}")
    windows = header.get("group_windows", [None])  # absent in version 2: one full group
    if (
        not isinstance(windows, list)
        or not 1 <= len(windows) <= MAX_REPLAY_GROUPS
        or not all(w is None or (_is_count(w) and w >= 1) for w in windows)
    ):
        raise ValueError(
            f"{path}: header group_windows {windows!r} must list 1 to {MAX_REPLAY_GROUPS} "
            "windows (ints >= 1, or null for full attention)"
        )
    telemetry = PoolTelemetry(num_blocks, block_size, allocator, tuple(windows))
    cached = header.get("cached_blocks", [])
    if not isinstance(cached, list) or not all(_is_count(b) and b < num_blocks for b in cached):
        raise ValueError(f"{path}: header cached_blocks must be block ids below {num_blocks}")
    cached_groups = header.get("cached_groups", [0] * len(cached))
    if (
        not isinstance(cached_groups, list)
        or len(cached_groups) != len(cached)
        or not all(_is_count(g) and g < len(windows) for g in cached_groups)
    ):
        raise ValueError(
            f"{path}: header cached_groups must give each cached block a group below {len(windows)}"
        )
    telemetry.state[cached] = BlockState.CACHED
    telemetry.has_hash[cached] = True
    telemetry.group[cached] = cached_groups
    telemetry.counters = _counters(path, header.get("counters", {}))
    shadow = None
    if with_shadow and allocator == "paged":
        max_seq_len = header.get("max_seq_len")
        if not _is_count(max_seq_len) or max_seq_len < 1:
            raise ValueError(f"{path}: header max_seq_len {max_seq_len!r} is not an int >= 1")
        shadow = ContiguousShadow(num_blocks, block_size, max_seq_len, num_groups=len(windows))
    for number, event in enumerate(events, start=1):
        try:
            telemetry(event)
            if shadow is not None:
                shadow(event)
        except (KeyError, IndexError, ValueError, AssertionError) as e:
            raise ValueError(
                f"{path}: event {number} ({event.kind}) does not follow from the ones before "
                f"it: {type(e).__name__}: {e}"
            ) from None
        if isinstance(event, StepProgress):
            yield telemetry.snapshot(), shadow.snapshot() if shadow is not None else None


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _counters(path: str | Path, values: object) -> PoolCounters:
    names = {f.name for f in dataclasses.fields(PoolCounters)}
    if (
        not isinstance(values, dict)
        or not values.keys() <= names
        or not all(_is_count(v) for v in values.values())
    ):
        raise ValueError(f"{path}: header counters must map {sorted(names)} to ints >= 0")
    return PoolCounters(**values)
