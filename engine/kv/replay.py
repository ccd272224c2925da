"""Replay a recorded session's KV events into the snapshots the live engine produced.

A session file is data from anywhere: its header is checked before anything is sized by it (the
pool's arrays against the memory this machine has), every event is checked against the pool
before it is applied (`engine.kv.replay_checks`), and whatever is malformed, out of range or
does not follow is a ValueError naming the file and the line, never another exception.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeGuard

from kvscope.engine.kv.events import StepProgress, read_numbered_events
from kvscope.engine.kv.replay_checks import EventCheck
from kvscope.engine.kv.session_json import MAX_INT, shown
from kvscope.engine.kv.shadow import ContiguousShadow
from kvscope.engine.kv.snapshot import BlockState, KVSnapshot
from kvscope.engine.kv.telemetry import PoolCounters, PoolTelemetry
from kvscope.engine.memory.device_memory import system_memory

__all__ = ["replay_events"]

# 1.7x the largest real pool (a 141 GiB GPU holds ~10^7 blocks of the smallest models); a
# replay of it takes ~3 GiB (below), and 2^26 blocks took 6.6 GB before numpy gave up.
MAX_REPLAY_BLOCKS = 1 << 24
# Peak memory per pool block (measured over 4M blocks, RSS): the telemetry's arrays and one
# snapshot's copies; the shadow adds its own and a reservation as long as the pool.
BYTES_PER_BLOCK, SHADOW_BYTES_PER_BLOCK = 80, 120
ALLOCATORS = ("paged", "contiguous")
MAX_REPLAY_GROUPS = 256  # KV groups: a model has at most as many as layers; int8 holds them
MAX_SEQ_LEN = 1 << 24  # tokens; above every model's context (the longest is 10M)


def replay_events(
    path: str | Path, with_shadow: bool = False
) -> Iterator[tuple[KVSnapshot, KVSnapshot | None]]:
    """Yield (pool, contiguous shadow or None) after every engine step in the file."""
    header, events = read_numbered_events(path)
    # A header is data: check it before sizing arrays by it (a crafted one asked for 931 GiB).
    num_blocks = _header_count(path, header, "num_blocks", MAX_REPLAY_BLOCKS)
    block_size = _header_count(path, header, "block_size", 1024)
    _check_memory(path, num_blocks, with_shadow)
    allocator = header.get("allocator")
    if not isinstance(allocator, str) or allocator not in ALLOCATORS:
        raise ValueError(f"{path}: header allocator {shown(allocator)} is not one of {ALLOCATORS}")
    windows = header.get("group_windows", [None])  # absent in version 2: one full group
    if (
        not isinstance(windows, list)
        or not 1 <= len(windows) <= MAX_REPLAY_GROUPS
        or not all(w is None or (_is_count(w) and 1 <= w <= MAX_SEQ_LEN) for w in windows)
    ):
        raise ValueError(
            f"{path}: header group_windows {shown(windows)} must list 1 to {MAX_REPLAY_GROUPS} "
            f"windows (ints in [1, {MAX_SEQ_LEN:,}], or null for full attention)"
        )
    telemetry = PoolTelemetry(num_blocks, block_size, allocator, tuple(windows))
    cached = header.get("cached_blocks", [])
    if (
        not isinstance(cached, list)
        or not all(_is_count(b) and b < num_blocks for b in cached)
        or len(set(cached)) != len(cached)
    ):
        raise ValueError(
            f"{path}: header cached_blocks must be distinct block ids below {num_blocks}"
        )
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
    needs_shadow = with_shadow and allocator == "paged"
    max_seq_len = None
    if needs_shadow or header.get("max_seq_len") is not None:
        max_seq_len = _header_count(path, header, "max_seq_len", MAX_SEQ_LEN)
    shadow = None
    if needs_shadow:
        assert max_seq_len is not None  # read above: a shadow needs it
        shadow = ContiguousShadow(num_blocks, block_size, max_seq_len, num_groups=len(windows))
    # A table spans max_seq_len tokens (one entry more for the token being written).
    max_table = -(-max_seq_len // block_size) + 1 if max_seq_len else num_blocks + 1
    check = EventCheck(telemetry, max_table)
    for number, (line, event) in enumerate(events, start=1):
        where = (
            f"{path}:{line}: event {number} ({event.kind}) does not follow from the ones before it"
        )
        try:
            check(event)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        try:
            telemetry(event)
            if shadow is not None:
                shadow(event)
        except (KeyError, IndexError, ValueError, AssertionError) as e:  # what the checks miss
            raise ValueError(f"{where}: {type(e).__name__}: {e}") from None
        if isinstance(event, StepProgress):
            yield telemetry.snapshot(), shadow.snapshot() if shadow is not None else None


def _check_memory(path: str | Path, num_blocks: int, with_shadow: bool) -> None:
    """Refuse a pool whose replay would not fit in the memory this machine has free."""
    need = num_blocks * (BYTES_PER_BLOCK + (SHADOW_BYTES_PER_BLOCK if with_shadow else 0))
    available = system_memory()[1]
    if available is not None and need > available:
        raise ValueError(
            f"{path}: header num_blocks {num_blocks:,}: replaying that pool takes about "
            f"{need / 2**20:,.0f} MiB, and this machine has {available / 2**20:,.0f} MiB available"
        )


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT


def _header_count(path: str | Path, header: dict[str, Any], key: str, high: int) -> int:
    """The header's `key`, checked to be an int in [1, high]."""
    value = header.get(key)
    if not _is_count(value) or not 1 <= value <= high:
        raise ValueError(f"{path}: header {key} {shown(value)} is not in [1, {high:,}]")
    return value


def _counters(path: str | Path, values: object) -> PoolCounters:
    names = {f.name for f in dataclasses.fields(PoolCounters)}
    if (
        not isinstance(values, dict)
        or not values.keys() <= names
        or not all(_is_count(v) for v in values.values())
    ):
        raise ValueError(f"{path}: header counters must map {sorted(names)} to ints >= 0")
    return PoolCounters(**values)
