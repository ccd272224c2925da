"""The parts of an engine that hold and hand out its KV pool, built in one place from one
config: the sequence cap, the event stream and its observers, the allocator and the scheduler.

The engine builds them over a real pool; the what-if simulator (engine.whatif.sim_engine) builds
exactly the same ones from a simulated config, so the two never drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.engine.config import EngineConfig
from kvscope.engine.kv.allocator import KVAllocator
from kvscope.engine.kv.contiguous import ContiguousAllocator
from kvscope.engine.kv.layout import KVLayout
from kvscope.engine.kv.observers import PoolObservers
from kvscope.engine.kv.paged import PagedAllocator
from kvscope.engine.scheduler import Scheduler


@dataclass(frozen=True)
class PoolParts:
    max_seq_len: int
    observers: PoolObservers
    allocator: KVAllocator
    scheduler: Scheduler


def build_pool(
    config: EngineConfig,
    layout: KVLayout,
    num_blocks: int,
    max_model_len: int,
    cache_salt: bytes,
    with_shadow: bool = True,
    with_snapshots: bool = True,
) -> PoolParts:
    chunk = config.batched_tokens_limit
    # A sequence may not outgrow the pool: capping here is what keeps preemption deadlock-free.
    # Sliding groups hold at most their window (plus a prefill chunk), not the whole context.
    max_seq_len = layout.max_tokens_for_blocks(num_blocks, chunk, max_model_len)
    # Every change to the pool goes through one event stream; snapshots, the contiguous
    # shadow, the counters stats() reports and recordings all follow it.
    observers = PoolObservers(
        num_blocks,
        config.block_size,
        config.allocator,
        max_seq_len,
        layout.windows,
        with_shadow=with_shadow,
        with_snapshots=with_snapshots,
    )
    events = observers.events
    allocator: KVAllocator
    if config.allocator == "contiguous":
        allocator = ContiguousAllocator(num_blocks, config.block_size, max_seq_len, events)
    else:
        allocator = PagedAllocator(
            num_blocks,
            config.block_size,
            enable_prefix_caching=config.enable_prefix_caching,
            cache_salt=cache_salt,
            events=events,
            layout=layout,
        )
    scheduler = Scheduler(
        allocator, events, config.max_num_seqs, chunk, config.prefill_tokens_beside_decodes
    )
    return PoolParts(max_seq_len, observers, allocator, scheduler)
