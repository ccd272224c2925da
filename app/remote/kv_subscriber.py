"""Follow one server's KV event stream: a SUB socket, the replay DEALER, a thread of its own.

This module holds the sockets, the thread and the connection states; what the frames mean
(seq order, gaps, replays, restarts, the status they add up to) is the KVStream it owns
(app/remote/kv_stream.py).

Protocol (vLLM 0.33's vllm/distributed/kv_events.py; app/serve/kv_events.py is ours): the PUB
socket sends multipart (topic, seq as 8-byte big-endian, payload); the replay socket is read by
app/remote/kv_replay.py. tests/app/serve/test_vllm_kv_events.py feeds this subscriber from vLLM's
own publisher.

What the thread does, and why:
- On connecting it asks the replay socket for everything buffered from seq 0, so a server that
  is idle (and sends nothing live) still shows what it holds.
- Batches reach `on_batch(seq, batch)` once each, in seq order. A gap in the live seqs is
  filled from the replay socket; what it cannot give back is counted in `missed`, and so is
  the history before the first batch we hold (a publisher counts from seq 0: joining at seq N
  without a replay that reaches back to 0 misses N batches, and `first_seq` says so). A replay
  request that gets no answer within `replay_timeout_s` is given up (the DEALER is replaced so
  a late answer cannot be mistaken for the next one) and further replays back off.
- A restart is a live seq that is not above the previous live seq (a fresh publisher counts
  from 0), or, after a reconnect, a replayed batch at our last seq whose bytes differ from the
  ones we applied. Then `restarts` counts, the consumer gets a synthetic AllBlocksCleared batch
  (seq -1) so its cache starts over, and the new server's history is replayed from 0. An
  AllBlocksCleared the server sends after the stream's first batch counts in `resets` (vLLM
  sends one when its prefix cache is reset; a cache that clears itself is not proof of a
  restart, and our own server opens every stream with one).
- A frame that does not decode is counted in `malformed`, its seq is consumed, and the thread
  carries on; so is one that stores more blocks than the replica's pool (`set_pool`). A big
  frame is decoded a slice at a time (kv_frames.py), so the GUI thread gets the GIL meanwhile.
  A seq past MAX_SEQ (2^40: 35 years of 1,000 steps a second) is malformed too, so that one
  absurd frame cannot make every later batch look old.
- Reconnecting is ZMQ's own, with exponential backoff from `backoff[0]` to `backoff[1]`
  seconds (RECONNECT_IVL / RECONNECT_IVL_MAX) and heartbeats so a vanished host is noticed; a
  socket monitor tells connected from not. States: "connecting" (not connected: first try or
  after losing the server; `retry_at` says when ZMQ tries again), "live" (connected, a frame
  within `silent_after_s`), "silent" (connected, nothing for `silent_after_s`: an idle server,
  or a link that died without closing), "stopped".
- `stop()` returns within `timeout` in every state: every wait is sliced to POLL_S."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from kvscope.app.remote.kv_replay import ReplayClient
from kvscope.app.remote.kv_stream import KVStream, SubscriberStatus
from kvscope.app.remote.kv_wire import EventBatch

log = logging.getLogger(__name__)

POLL_S = 0.05
MAX_FRAME_BYTES = 64 << 20  # a batch of thousands of 16-token blocks is a few MiB


class KVEventSubscriber:
    """The sockets and the thread; what the frames mean is its KVStream's (kv_stream.py)."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        on_batch: Callable[[int, EventBatch], None] | None = None,
        on_status: Callable[[SubscriberStatus], None] | None = None,
        backoff: tuple[float, float] = (0.5, 10.0),
        silent_after_s: float = 10.0,
        replay_timeout_s: float = 2.0,
        heartbeat_s: float = 2.0,
    ) -> None:
        lo, hi = backoff
        if not 0 < lo <= hi:
            raise ValueError(f"backoff must be (first, cap) with 0 < first <= cap, got {backoff!r}")
        self.endpoint = endpoint
        self._stop = threading.Event()
        self.stream = KVStream(
            endpoint, on_batch, on_status, replay=bool(replay_endpoint), stopping=self._stop.is_set
        )
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode("utf-8")
        self.backoff = (lo, hi)
        self.silent_after_s = silent_after_s
        self.replay_timeout_s = replay_timeout_s
        self.heartbeat_s = heartbeat_s
        self._thread: threading.Thread | None = None
        self._ctx: zmq.Context | None = None

    # ---- public ------------------------------------------------------------------------
    def start(self) -> KVEventSubscriber:
        if self._thread is not None:
            raise RuntimeError("KVEventSubscriber.start() called twice")
        self._thread = threading.Thread(target=self._run, name="kvscope-kv-sub", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.stream.update(state="stopped", connected=False, retry_at=None)

    def status(self) -> SubscriberStatus:
        return self.stream.status()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def set_pool(self, num_gpu_blocks: int | None) -> None:
        """The replica's pool, in blocks, as its metrics report it (None: not known): a batch
        that stores more blocks than that is malformed, and not applied."""
        valid = num_gpu_blocks is not None and num_gpu_blocks > 0
        self.stream.pool_blocks = num_gpu_blocks if valid else None

    # ---- the thread --------------------------------------------------------------------
    def _run(self) -> None:
        delay = self.backoff[0]
        while not self._stop.is_set():
            ctx = zmq.Context()
            try:
                self._serve(ctx)
                delay = self.backoff[0]
            except Exception as e:  # a socket error, or our own bug: never end the thread
                if not isinstance(e, zmq.ZMQError):
                    log.exception("KV subscriber for %s failed; starting over", self.endpoint)
                self.stream.update(
                    state="connecting",
                    connected=False,
                    error=f"KV events {self.endpoint}: {e}",
                    retry_at=time.time() + delay,
                )
                self._stop.wait(delay)
                delay = min(delay * 2, self.backoff[1])
            finally:
                ctx.destroy(linger=0)
        self.stream.update(state="stopped", connected=False, retry_at=None)

    def _socket(
        self, ctx: zmq.Context, kind: int, endpoint: str, connect: bool = True
    ) -> zmq.Socket:
        sock = ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        # A frame over this is a broken or hostile peer: ZMQ drops the connection (and
        # reconnects) instead of this process allocating whatever the peer announces.
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        sock.setsockopt(zmq.RECONNECT_IVL, int(self.backoff[0] * 1000))
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, int(self.backoff[1] * 1000))
        ms = int(self.heartbeat_s * 1000)
        sock.setsockopt(zmq.HEARTBEAT_IVL, ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * ms)
        if kind == zmq.SUB:
            sock.setsockopt(zmq.SUBSCRIBE, self.topic)
            sock.setsockopt(zmq.RCVHWM, 100_000)
        if connect:
            sock.connect(endpoint)
        return sock

    def _serve(self, ctx: zmq.Context) -> None:
        sub = self._socket(ctx, zmq.SUB, self.endpoint, connect=False)
        # The monitor before the connect: a fast connection must not beat it to the event.
        monitor = sub.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED
        )
        sub.connect(self.endpoint)
        self._ctx = ctx
        replay = None
        replay_endpoint = self.replay_endpoint
        if replay_endpoint:
            replay = ReplayClient(
                lambda: self._socket(ctx, zmq.DEALER, replay_endpoint),
                replay_endpoint,
                on_malformed=lambda why: self.stream.bump("malformed", error=why),
                stopping=self._stop.is_set,
                backoff=self.backoff,
                gap_s=self.replay_timeout_s,
            )
        self.stream.use_replay(replay)
        self._dropped_at: float | None = None
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(int(POLL_S * 1000)))
                if monitor in ready:
                    self._on_monitor(monitor)
                if sub in ready:
                    for _ in range(1000):  # a bounded drain, so stop and liveness stay prompt
                        try:
                            frames = sub.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self.stream.on_live(frames)
                        if self._stop.is_set():
                            break
                self.stream.tick(self.silent_after_s)
                if self._abandoned():
                    return  # _run makes a fresh socket; the seqs we hold stay, gaps replay
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)
            if replay is not None:
                replay.close()

    def _on_monitor(self, monitor: zmq.Socket) -> None:
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = event["event"]
            if kind in (zmq.EVENT_CONNECTED, zmq.EVENT_CONNECT_RETRIED):
                self._dropped_at = None
            if kind == zmq.EVENT_CONNECTED:
                self.stream.on_connected()
            elif kind == zmq.EVENT_DISCONNECTED:
                self._dropped_at = time.monotonic()
                self.stream.update(
                    state="connecting",
                    connected=False,
                    error=f"connection to {self.endpoint} lost; reconnecting",
                )
            elif kind == zmq.EVENT_CONNECT_RETRIED:
                interval = event["value"] / 1000
                trouble = "lost" if self.stream.was_connected else "not reached yet"
                self.stream.update(
                    state="connecting",
                    connected=False,
                    retry_at=time.time() + interval,
                    retry_in_s=interval,
                    error=f"connection to {self.endpoint} {trouble}; retrying in {interval:g} s",
                )

    def _abandoned(self) -> bool:
        """ZMQ retries a lost server by itself, but not a peer it dropped for a protocol
        error (a frame over MAX_FRAME_BYTES): no retry event follows the disconnect. Then the
        socket is made anew, after the longest backoff."""
        dropped = self._dropped_at
        return dropped is not None and time.monotonic() - dropped > self.backoff[1] + 1.0
