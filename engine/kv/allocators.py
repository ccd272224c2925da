"""The allocator an engine's settings ask for: paged (blocks on demand, shared prefixes) or the
naive contiguous one. One place, so the engine and the what-if simulator (engine.whatif) build
exactly the same allocator from the same settings."""

from __future__ import annotations

from engine.kv.allocator import KVAllocator
from engine.kv.block_manager import BlockManager
from engine.kv.contiguous import ContiguousBlockManager
from engine.kv.events import EventLog
from engine.kv.layout import KVLayout


def make_allocator(
    allocator: str,
    num_blocks: int,
    layout: KVLayout,
    max_seq_len: int,
    enable_prefix_caching: bool,
    cache_salt: bytes,
    events: EventLog,
) -> KVAllocator:
    if allocator == "contiguous":
        return ContiguousBlockManager(num_blocks, layout.block_size, max_seq_len, events)
    return BlockManager(
        num_blocks,
        layout.block_size,
        enable_prefix_caching=enable_prefix_caching,
        cache_salt=cache_salt,
        events=events,
        layout=layout,
    )
