"""KV-cache events in vLLM's wire format, published over ZMQ, so routers built for vLLM (NVIDIA
Dynamo's KV router, llm-d) can follow KVScope's prefix cache.

As vLLM 0.33.0 sends them (vllm/distributed/kv_events.py), checked by
tests/app/serve/test_vllm_kv_events.py with vLLM's own decoder, replay client, example subscriber
and publisher from its wheel and
sources:

- a `KVEventBatch(ts, events, data_parallel_rank)`, array-like, of tagged `BlockStored` /
  `BlockRemoved` / `AllBlocksCleared` structs encoded as maps (field names as keys, the tag
  under "type"), msgpack by msgspec. `encoding="array"` (`--kv-events-encoding array`) encodes
  the events positionally instead, as vLLM releases before the map layout did;
- the PUB socket sends multipart (topic, seq as 8-byte big-endian, payload);
- the replay ROUTER answers (identity, b"", start seq as 8 bytes big-endian) with
  (identity, b"", topic, seq, payload) for every buffered batch from that seq, then the end
  marker (identity, b"", b"", -1 as 8 bytes, b"").

Block hashes are vLLM's (app/core/block_hashes.py): each block announced is hashed with
`--prefix-caching-hash-algo` (vLLM's names; sha256 by default, as vLLM's) from its parent's digest
and its token ids, NONE_HASH seeded from PYTHONHASHSEED or, unset, as vLLM seeds it. A router
that predicts vLLM's hashes from a prompt therefore predicts ours. The engine keeps its own
internal keys (engine/kv/paged.py); this module maps one to the other. The events carry
the low 64 bits as an int (vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, its default) or, with
that variable set to 0, the digest bytes.

`group_idx` is the engine's KV group (0 unless its layers differ, e.g. sliding windows); `medium`
is "GPU", vLLM's name for the primary KV pool (a router reads "CPU" as an offload tier), whatever
device the engine runs on."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import OrderedDict, deque
from functools import cache
from itertools import count
from typing import Any, Protocol

import msgspec
import zmq

from kvscope.app.core.block_hashes import DEFAULT_ALGO, BlockHasher, external_hash, none_hash_seed
from kvscope.engine import LLMEngine

log = logging.getLogger(__name__)

MEDIUM_GPU = "GPU"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
ENCODINGS = ("map", "array")  # the first is vLLM 0.33's and our default


class _StoredRun(Protocol):
    """The fields of a BlockStored (built per encoding by event_structs) that a run extends."""

    block_hashes: list[int | bytes]
    token_ids: list[int]
    group_idx: int | None


@cache
def event_structs(encoding: str = "map") -> dict[str, type]:
    """vLLM's structs, field for field, in one layout (EventBatch is array-like in both)."""
    if encoding not in ENCODINGS:
        raise ValueError(f"KV event encoding must be one of {ENCODINGS}, got {encoding!r}")
    array_like = encoding == "array"

    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]
        data_parallel_rank: int | None = None

    class KVCacheEvent(
        msgspec.Struct, array_like=array_like, omit_defaults=True, gc=False, tag=True
    ):
        """Base class for all KV cache-related events"""

    class BlockStored(KVCacheEvent):
        block_hashes: list[int | bytes]
        parent_block_hash: int | bytes | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[tuple[Any, ...] | None] | None = None
        group_idx: int | None = None
        kv_cache_spec_kind: str | None = None
        kv_cache_spec_sliding_window: int | None = None
        locality: str | None = None
        ownership: str | None = None
        session_id: str | None = None
        lookahead_token_ids: list[list[int]] | None = None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[int | bytes]
        medium: str | None
        group_idx: int | None = None
        locality: str | None = None
        ownership: str | None = None

    class AllBlocksCleared(KVCacheEvent):
        pass

    class KVEventBatch(EventBatch):
        events: list[BlockStored | BlockRemoved | AllBlocksCleared]

    return {
        "KVEventBatch": KVEventBatch,
        "BlockStored": BlockStored,
        "BlockRemoved": BlockRemoved,
        "AllBlocksCleared": AllBlocksCleared,
    }


def vllm_hasher(algo: str = DEFAULT_ALGO, seed: str | None = None) -> BlockHasher:
    """The hasher vLLM would use in this process: `seed` is PYTHONHASHSEED (None: read the
    environment; unset, vLLM's fixed seed for sha256 / sha256_cbor and a random one for the
    xxhash algorithms, as vLLM's init_none_hash does)."""
    if seed is None:
        seed = os.environ.get("PYTHONHASHSEED")
    resolved = none_hash_seed(seed, algo)
    if resolved is None:
        resolved = os.urandom(32).hex()  # vLLM keeps non-cryptographic seeds secret too
    return BlockHasher(algo, resolved, int_hashes=_int_hashes())


def _int_hashes() -> bool:
    """vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (default 1)."""
    return bool(int(os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1") or "1"))


class KVEventTranslator:
    """Listens to the engine's pool events (in the engine thread) and turns them into vLLM's:
    blocks that become hashed -> BlockStored (one per chained run), an evicted cached block ->
    BlockRemoved. `take()` hands over what one step produced."""

    def __init__(
        self, engine: LLMEngine, encoding: str = "map", hasher: BlockHasher | None = None
    ) -> None:
        self.engine = engine
        self.block_size = engine.config.block_size
        self.structs = event_structs(encoding)
        self.hasher = hasher or vllm_hasher()
        self.hash_of: dict[int, tuple[int | bytes, int]] = {}  # block id -> (hash, group) sent
        # Engine key -> vLLM digest of the same prefix. A child is hashed after its parent
        # (same sequence, same step or later), so the parent's digest is here when needed; kept
        # past the parent's eviction for a while, bounded, since a cached child can outlive it.
        self._digest: OrderedDict[int, bytes] = OrderedDict()
        self._digest_cap = 4 * engine.stats()["kv_blocks_total"] + 1024
        self.unhashable = 0  # blocks whose parent's digest was gone: not announced
        # Whatever the pool already holds (the app's engine may have run): clear, then restate.
        self._pending: list[Any] = [self.structs["AllBlocksCleared"]()]
        held = engine.kv_snapshot().has_hash.nonzero()[0].tolist()
        self._stored(held)
        engine.subscribe_kv_events(self)

    def close(self) -> None:
        self.engine.unsubscribe_kv_events(self)

    def __call__(self, event) -> None:
        if event.kind == "blocks_hashed":
            self._stored(event.blocks)
        elif event.kind == "block_evicted":
            announced = self.hash_of.pop(event.block, None)
            if announced is not None:
                h, group = announced
                self._pending.append(
                    self.structs["BlockRemoved"](
                        block_hashes=[h], medium=MEDIUM_GPU, group_idx=group
                    )
                )

    def _vllm_digest(self, key: int, parent: int | None, tokens) -> bytes | None:
        digest = self._digest.get(key)
        if digest is not None:
            self._digest.move_to_end(key)
            return digest
        parent_digest = None
        if parent is not None:
            parent_digest = self._digest.get(parent)
            if parent_digest is None:
                return None
        digest = self.hasher.hash_block(parent_digest, tokens)
        self._digest[key] = digest
        if len(self._digest) > self._digest_cap:
            self._digest.popitem(last=False)
        return digest

    def _stored(self, blocks) -> None:
        BlockStored = self.structs["BlockStored"]
        int_hashes = self.hasher.int_hashes
        run: _StoredRun | None = None
        for block in blocks:
            key = self.engine.block_hash(block)
            if key is None:
                continue
            own, own_parent, tokens, group = key
            digest = self._vllm_digest(own, own_parent, tokens)
            if digest is None:
                self.unhashable += 1
                log.warning("KV events: block %d's parent is unknown; not announced", block)
                continue
            h = external_hash(digest, int_hashes)
            parent = None
            if own_parent is not None:
                parent = external_hash(self._digest[own_parent], int_hashes)
            self.hash_of[block] = (h, group)
            if run is not None and run.group_idx == group and run.block_hashes[-1] == parent:
                run.block_hashes.append(h)
                run.token_ids.extend(tokens)
                continue
            run = BlockStored(
                block_hashes=[h],
                parent_block_hash=parent,
                token_ids=list(tokens),
                block_size=self.block_size,
                lora_id=None,
                medium=MEDIUM_GPU,
                lora_name=None,
                # vLLM's KV cache group; the spec kind (full / sliding) is left out: which
                # group slides is the engine's layout, not visible here.
                group_idx=group,
            )
            self._pending.append(run)

    def take(self):
        """The batch of events since the last call, or None when there were none."""
        if not self._pending:
            return None
        events, self._pending = self._pending, []
        return self.structs["KVEventBatch"](ts=time.time(), events=events, data_parallel_rank=0)


class ZmqEventPublisher:
    """PUB socket plus an optional replay ROUTER with a bounded buffer, served by one thread
    that owns both sockets (ZMQ sockets are not thread-safe). Both bind: the server is the
    stable end, as vLLM's default `tcp://*:5557` is."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
    ) -> None:
        self._ctx: zmq.SyncContext = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        self._replay: zmq.SyncSocket | None = None
        try:
            self._pub.bind(endpoint)
            if replay_endpoint:
                self._replay = self._ctx.socket(zmq.ROUTER)
                # A whole replay plus its end marker must fit the send queue, as in vLLM: ZMQ
                # acknowledges reads only every HWM/2 messages.
                self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
                self._replay.bind(replay_endpoint)
        except zmq.ZMQError as e:
            self._close_sockets()
            raise ValueError(
                f"cannot bind KV event socket {endpoint!r} / {replay_endpoint!r}: {e}"
            ) from e
        self._topic = topic.encode("utf-8")
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._queue: queue.Queue = queue.Queue(maxsize=100_000)
        self._seq = count()
        self._encoder = msgspec.msgpack.Encoder()
        self._running = True
        self._thread = threading.Thread(target=self._serve, name="kvscope-kv-events", daemon=True)
        self._thread.start()

    def publish(self, batch) -> None:
        try:
            self._queue.put_nowait(batch)
        except queue.Full:  # a stalled publisher must not stall the engine
            log.warning("KV event queue full; dropping a batch (subscribers will see a seq gap)")

    def shutdown(self) -> None:
        self._running = False
        self._queue.put(None)
        self._thread.join(timeout=2)
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def _serve(self) -> None:
        while True:
            if self._replay is not None and self._replay.poll(0):
                try:
                    self._answer_replay(self._replay)
                except zmq.ZMQError:
                    log.exception("KV event replay failed")
            try:
                batch = self._queue.get(timeout=0.05)
            except queue.Empty:
                if not self._running:
                    return
                continue
            if batch is None:
                return
            seq = next(self._seq)
            payload = self._encoder.encode(batch)
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            self._buffer.append((seq, payload))

    def _answer_replay(self, replay: zmq.SyncSocket) -> None:
        frames = replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("ignoring a malformed KV event replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= start_seq:
                replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
        replay.send_multipart((client, b"", b"", END_SEQ, b""))
