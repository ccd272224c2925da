"""Big KV event frames as vLLM's own classes encode them (tests/vllm_code.py imports them from
its wheel), for the tests of decoding a frame a slice at a time (app/remote/kv_frames.py)."""

from __future__ import annotations

import hashlib
import time

import msgspec
import vllm_code

BS = 16


def vllm_events():
    """vLLM's vllm.distributed.kv_events, as its wheel ships it."""
    return vllm_code.module("vllm.distributed.kv_events")


def stored_events(blocks: int, per_event: int | None = None, first: int = 0, medium="GPU"):
    """vLLM BlockStored events holding `blocks` blocks, `per_event` each (one event: all of
    them), chained by parent hash: 32-byte digests as hashes (vLLM's with
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) and token ids past 256, of 1 to 3 bytes' worth."""
    kv = vllm_events()
    per = per_event or blocks
    events, parent = [], None
    for start in range(first, first + blocks, per):
        n = min(per, first + blocks - start)
        hashes = [hashlib.sha256(i.to_bytes(8, "big")).digest() for i in range(start, start + n)]
        tokens = [300 + (j * 7919) % 100_000 for j in range(start * BS, (start + n) * BS)]
        events.append(
            kv.BlockStored(
                block_hashes=hashes,
                parent_block_hash=parent,
                token_ids=tokens,
                block_size=BS,
                lora_id=None,
                medium=medium,
                lora_name=None,
                group_idx=0,
            )
        )
        parent = hashes[-1]
    return events


def frame(events, ts: float | None = None) -> bytes:
    """One KVEventBatch of `events`, as vLLM's publisher encodes it."""
    kv = vllm_events()
    batch = kv.KVEventBatch(ts=time.time() if ts is None else ts, events=events)
    return msgspec.msgpack.encode(batch)


def flat(events) -> list[tuple]:
    """The blocks the events store, in order, as (hash, parent, token ids, block size)."""
    out = []
    for event in events:
        parent = event.parent_block_hash
        bs = event.block_size
        for i, h in enumerate(event.block_hashes):
            out.append((h, parent, tuple(event.token_ids[i * bs : (i + 1) * bs]), bs))
            parent = h
    return out
