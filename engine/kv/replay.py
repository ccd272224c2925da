"""Replay a recorded session's KV events into the snapshots the live engine produced."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from engine.kv.events import read_events
from engine.kv.shadow import ContiguousShadow
from engine.kv.snapshot import BlockState, KVSnapshot
from engine.kv.telemetry import PoolTelemetry

# Far above any real pool (a 141 GiB GPU holds ~10^7 blocks of the smallest models).
MAX_REPLAY_BLOCKS = 1 << 26


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
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
            raise ValueError(f"{path}: header {key} {value!r} is not in [1, {high:,}]")
    telemetry = PoolTelemetry(num_blocks, block_size, header["allocator"])
    cached = np.asarray(header.get("cached_blocks", []), dtype=np.int64)
    telemetry.state[cached] = BlockState.CACHED
    telemetry.has_hash[cached] = True
    for name, value in header.get("counters", {}).items():
        setattr(telemetry, name, value)
    shadow = None
    if with_shadow and header["allocator"] == "paged":
        shadow = ContiguousShadow(num_blocks, block_size, header["max_seq_len"])
    for event in events:
        telemetry(event)
        if shadow is not None:
            shadow(event)
        if event.kind == "progress":
            yield telemetry.snapshot(), shadow.snapshot() if shadow is not None else None
