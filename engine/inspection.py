"""What an engine shows of itself: `stats()` and the contents of one block.

Read-only views over the engine's parts, kept apart from the request path. Counters come from one
owner each: the pool telemetry for traffic (preemptions, prefix-cache queries and hits, the same
numbers the snapshot reports), the allocator for occupancy, the scheduler for concurrency.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from kvscope.engine.kv.snapshot import BlockState

if TYPE_CHECKING:
    from kvscope.engine.config import EngineConfig
    from kvscope.engine.kv.allocator import KVAllocator
    from kvscope.engine.kv.kv_cache import KVCache
    from kvscope.engine.kv.layout import KVLayout
    from kvscope.engine.kv.observers import PoolObservers
    from kvscope.engine.model.llama import LlamaModel
    from kvscope.engine.scheduler import Scheduler
    from kvscope.engine.sequence import Request, Sequence
    from kvscope.engine.sizing.float32_weights import WeightChoice


# Only a what-if simulation's engine runs without the per-block telemetry, and nothing inspects it.
_NO_TELEMETRY = "an engine built without snapshots has no per-block telemetry"


class InspectedEngine(Protocol):
    """The parts of an engine these views read (LLMEngine has them all): declared here, so that
    this module need not import the engine that calls it."""

    config: EngineConfig
    allocator: KVAllocator
    observers: PoolObservers
    kv_cache: KVCache
    kv_layout: KVLayout
    scheduler: Scheduler
    requests: dict[str, Request]
    model: LlamaModel
    tokenizer: Any
    weight_choice: WeightChoice
    weight_bytes: int
    weight_format: dict[str, str]
    max_model_len: int
    num_steps: int
    num_threads: int


def engine_stats(engine: InspectedEngine) -> dict[str, Any]:
    bm = engine.allocator
    counters = engine.observers.counters
    telemetry = engine.observers.telemetry
    assert telemetry is not None, _NO_TELEMETRY
    return {
        "kv_block_size": bm.block_size,
        "kv_blocks_total": bm.num_blocks,
        "kv_blocks_used": bm.num_used_blocks,
        "kv_blocks_free": bm.num_free_blocks,
        "kv_blocks_cached": bm.num_cached_blocks,
        "kv_blocks_peak": bm.peak_used_blocks,
        # Physical slots holding K/V: a block shared by several sequences counts once.
        "kv_tokens_stored": telemetry.tokens_stored(),
        "kv_cache_bytes": engine.kv_cache.nbytes,
        "num_running": len(engine.scheduler.running),
        "num_waiting": len(engine.scheduler.waiting),
        "num_preemptions": counters.num_preemptions,
        "peak_num_running": engine.scheduler.peak_num_running,
        "prefix_cache_query_tokens": counters.prefix_query_tokens,
        "prefix_cache_hit_tokens": counters.prefix_hit_tokens,
        "prefix_cache_evictions": bm.num_evictions,
        "kv_cow_copies": bm.num_cow_copies,
        # KV groups (engine.kv.layout): each one's window (None = full attention), and the
        # blocks sliding windows gave back while their sequences ran.
        "kv_group_windows": list(engine.kv_layout.windows),
        "kv_blocks_released": counters.blocks_released,
        "max_model_len": engine.max_model_len,
        "num_steps": engine.num_steps,
        "allocator": engine.config.allocator,
        "kv_cache_dtype": str(engine.config.kv_torch_dtype).removeprefix("torch."),
        "weight_bytes": engine.weight_bytes,
        "weight_format": engine.weight_format["format"],
        "weight_layout": engine.weight_format["layout"],
        "weight_choice": engine.weight_choice.note,
        "dtype": str(engine.model.dtype).removeprefix("torch."),
        "num_threads": engine.num_threads,
    }


def block_contents(engine: InspectedEngine, block_id: int) -> dict[str, Any]:
    """What one physical block holds: its token ids and their text, and who holds it."""
    bm = engine.allocator
    if not 0 <= block_id < bm.num_blocks:
        raise ValueError(f"block id {block_id} is outside the pool [0, {bm.num_blocks})")
    tel = engine.observers.telemetry
    assert tel is not None, _NO_TELEMETRY
    bs = bm.block_size
    state = BlockState(int(tel.state[block_id]))
    owners = [track.request_id for track in tel.seqs.values() if block_id in track.held()]
    token_ids: list[int] = []
    owner = int(tel.owner[block_id])
    index = int(tel.logical_index[block_id])
    if state is BlockState.USED and owner >= 0:
        seq = _live_sequence(engine, owner)
        if seq is not None:
            filled = min(bs, max(0, seq.num_computed_tokens - index * bs))
            token_ids = seq.token_ids[index * bs : index * bs + filled]
    elif state is BlockState.CACHED:
        token_ids = list(bm.cached_block_tokens(block_id) or ())
    return {
        "block_id": block_id,
        "state": state.name.lower(),
        "owners": owners,
        "logical_index": index,
        "ref_count": int(tel.ref_count[block_id]),
        "has_hash": bool(tel.has_hash[block_id]),
        "token_ids": token_ids,
        "text": engine.tokenizer.decode(token_ids) if token_ids else "",
    }


def block_hash(
    engine: InspectedEngine, block_id: int
) -> tuple[int, int | None, tuple[int, ...], int] | None:
    """(hash, parent hash, token ids, KV group) of a block holding a reusable prefix, else None.

    What a KV-event consumer (vLLM's BlockStored) needs to name the block; cheap, no decoding."""
    bm = engine.allocator
    if not 0 <= block_id < bm.num_blocks:
        raise ValueError(f"block id {block_id} is outside the pool [0, {bm.num_blocks})")
    blocks = getattr(bm, "blocks", None)  # only the paged allocator hashes blocks
    if blocks is None or blocks[block_id].block_hash is None:
        return None
    block = blocks[block_id]
    return block.block_hash, block.parent_hash, block.token_ids, getattr(block, "group", 0)


def _live_sequence(engine: InspectedEngine, seq_id: int) -> Sequence | None:
    for request in engine.requests.values():
        for seq in request.sequences:
            if seq.seq_id == seq_id:
                return seq
    return None
