"""KVStream: what a server's KV event frames mean, apart from the sockets that carry them.

The KVEventSubscriber that owns one (app/remote/kv_subscriber.py: the SUB socket, the replay
DEALER and the thread) feeds it frames and connection news. It hands batches to `on_batch` once
each in seq order, fills gaps from the replay client, counts what is lost, malformed or
restarted, and keeps the SubscriberStatus the consumer reads. Runs only on the subscriber's
thread, but `status()`, which takes the lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from kvscope.app.remote.kv_frames import decoding
from kvscope.app.remote.kv_replay import ReplayClient, ReplayFailed
from kvscope.app.remote.kv_wire import AllBlocksCleared, EventBatch, MalformedFrame

log = logging.getLogger(
    "kvscope.app.remote.kv_subscriber"
)  # one logger for the subscriber's thread

MAX_SEQ = 1 << 40
RESTART_SEQ = -1  # the seq of the synthetic clearing batch delivered on a restart
STATUS_EVERY_S = 0.25  # seq-only status changes are reported at most this often
WARN_EVERY_S = 10.0  # malformed frames are logged at most this often (a peer may send only those)


@dataclass(frozen=True)
class SubscriberStatus:
    state: str  # "connecting" | "live" | "silent" | "stopped"
    last_seq: int | None  # the last seq handed to on_batch
    recovered: int  # batches the replay socket gave back (gaps and the initial history)
    missed: int  # seqs lost for good (gaps the replay could not fill)
    malformed: int  # frames that did not decode
    restarts: int  # server restarts detected
    error: str  # the latest trouble, "" when none
    since: float  # time.time() the state was entered
    connected: bool = False
    retry_at: float | None = None  # time.time() of ZMQ's next connection attempt, when known
    retry_in_s: float | None = None  # the backoff interval that attempt waits (doubles to a cap)
    last_frame_at: float | None = None  # time.time() of the last live frame
    connected_at: float | None = None  # time.time() of the latest connection
    batches: int = 0  # batches handed to on_batch
    first_seq: int | None = None  # the first seq we hold: > 0 means older history is unknown
    resets: int = 0  # AllBlocksCleared after the stream's first batch (a cache reset, or a
    # restarted server announcing itself; our own server sends one as its seq 0)
    replay: bool = False  # a replay endpoint is configured
    malformed_error: str = ""  # why the latest malformed frame was not applied


class KVStream:
    def __init__(
        self,
        endpoint: str,
        on_batch: Callable[[int, EventBatch], None] | None,
        on_status: Callable[[SubscriberStatus], None] | None,
        replay: bool,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self.endpoint = endpoint
        self.on_batch = on_batch or (lambda seq, batch: None)
        self.on_status = on_status or (lambda status: None)
        self.stopping = stopping  # checked between the slices of a big frame's decoding
        # The replica's pool in blocks (vLLM's num_gpu_blocks), once its metrics say: a batch
        # that stores more is malformed. Set from another thread; read once per frame.
        self.pool_blocks: int | None = None
        self._warned_at = -WARN_EVERY_S
        self._lock = threading.Lock()
        self._status = SubscriberStatus(
            "connecting", None, 0, 0, 0, 0, "", time.time(), replay=replay
        )
        self._reported_at = 0.0
        self._report_pending = False
        # Thread-owned stream state.
        self._expected: int | None = None  # next seq to apply
        self._last_live: int | None = None  # last seq seen on the PUB socket
        self._last_payload: bytes | None = None  # payload of seq _expected - 1, to verify
        self._verify = False  # after a reconnect: check the server is the one we followed
        self._connected_at = 0.0
        self._was_connected = False
        self._last_frame_mono = 0.0
        self._replay: ReplayClient | None = None  # the subscriber's, per connection

    # ---- public ------------------------------------------------------------------------
    def status(self) -> SubscriberStatus:
        with self._lock:
            return self._status

    # ---- status ------------------------------------------------------------------------
    def update(self, **changes) -> None:
        """Change the status; the consumer hears it (seq-only changes at most every
        STATUS_EVERY_S)."""
        with self._lock:
            old = self._status
            if old.state == "stopped" and changes.get("state", "stopped") != "stopped":
                return
            new = replace(old, **changes)
            if new.state != old.state:
                new = replace(new, since=time.time())
            self._status = new
        seq_only = all(k in ("last_seq", "batches", "last_frame_at") for k in changes)
        now = time.monotonic()
        if new == old:
            return
        if seq_only and now - self._reported_at < STATUS_EVERY_S:
            self._report_pending = True  # tick() reports it once STATUS_EVERY_S has passed
            return
        self._report_pending = False
        self._reported_at = now
        try:
            self.on_status(new)
        except Exception:  # the consumer's bug must not end the stream
            log.exception("KV subscriber on_status callback failed")

    def bump(self, name: str, by: int = 1, error: str | None = None) -> None:
        """Add `by` to one of the status's counters, with the error that explains it."""
        status = self.status()
        changes = {name: getattr(status, name) + by}
        if error is not None:
            changes["error"] = error
            if name == "malformed":
                changes["malformed_error"] = error
        self.update(**changes)

    # ---- the connection ----------------------------------------------------------------
    @property
    def was_connected(self) -> bool:
        """Whether a connection was ever made (a retry then means it was lost)."""
        return self._was_connected

    def use_replay(self, client: ReplayClient | None) -> None:
        """The replay client of the connection being made (None: no replay endpoint)."""
        self._replay = client

    def on_connected(self) -> None:
        """The socket connected: say so, then catch up (after a reconnect, first check that the
        server is the one we followed)."""
        reconnect = self._expected is not None
        self._was_connected = True
        self._connected_at = time.monotonic()
        self.update(
            state="live",
            connected=True,
            retry_at=None,
            retry_in_s=None,
            error="",
            connected_at=time.time(),
        )
        if reconnect:
            self._verify = True  # same server, or a new one counting from 0?
        self._sync_on_connect()

    def tick(self, silent_after_s: float) -> None:
        """The thread's poll tick: a status change held back is reported once it is due, and a
        connection with no frame for `silent_after_s` is "silent"."""
        if self._report_pending and time.monotonic() - self._reported_at >= STATUS_EVERY_S:
            self._reported_at = time.monotonic()
            self._report_pending = False
            try:
                self.on_status(self.status())
            except Exception:
                log.exception("KV subscriber on_status callback failed")
        status = self.status()
        if not status.connected:
            return
        last = max(self._connected_at, self._last_frame_mono)
        quiet = time.monotonic() - last
        state = "silent" if quiet >= silent_after_s else "live"
        if state != status.state:
            self.update(state=state)

    # ---- sequence handling -------------------------------------------------------------
    def on_live(self, frames: list[bytes]) -> None:
        """One frame of the SUB socket: (topic, seq, payload)."""
        self._last_frame_mono = time.monotonic()
        if not self.status().connected:  # a frame proves it, whatever the monitor said
            self._connected_at = self._last_frame_mono
            self._was_connected = True
            self.update(state="live", connected=True, retry_at=None)
        self.update(last_frame_at=time.time())
        if len(frames) != 3 or len(frames[1]) != 8:
            self.bump(
                "malformed", error=f"a frame of {len(frames)} parts, not (topic, seq, payload)"
            )
            return
        _, seq_bytes, payload = frames
        seq = int.from_bytes(seq_bytes, "big", signed=True)
        if not 0 <= seq < MAX_SEQ:
            self.bump("malformed", error=f"a live frame with seq {seq}")
            return
        if self._verify:
            self._verify_same_server()
        if self._expected is not None and seq < self._expected:
            if self._last_live is None or seq > self._last_live:
                self._last_live = seq  # already applied from a replay
                return
            self._restarted(f"seq went back from {self._last_live} to {seq}")
        self._last_live = seq
        if self._expected is None:  # nothing applied yet: the history first, if it can be had
            self._fill(seq)
            if self._expected is None:
                self._expected = seq  # older history unknown (first_seq says from where)
                self._missed_before(seq)
        if seq > self._expected:
            self._fill(seq)
        if seq < self._expected:
            return  # the replay brought it already
        if seq > self._expected:  # not recovered
            self.bump("missed", seq - self._expected)
        self._apply(seq, payload)

    def _sync_on_connect(self) -> None:
        """On (re)connecting: the history the replay socket holds, and a restart check."""
        if self._replay is None:
            return
        if self._verify:
            self._verify_same_server()
            if self._verify:
                return  # the check could not run; retried on the next frame
        start = 0 if self._expected is None else self._expected
        try:
            self._replay_into(start, until=None)
        except ReplayFailed as e:
            self.update(error=str(e))

    def _verify_same_server(self) -> None:
        if self._expected is None or self._expected == 0 or self._last_payload is None:
            self._verify = False
            return
        if self._replay is None:
            self._verify = False
            return
        if not self._replay.ready():
            return  # backing off after a failed replay; checked again on a later frame
        last = self._expected - 1
        try:
            frames = self._replay.request(last)
        except ReplayFailed as e:
            self.update(error=str(e))
            return
        self._verify = False
        first = frames[0] if frames else None
        if first is None or first[0] != last or first[1] != self._last_payload:
            self._restarted(f"after reconnecting, seq {last} is not the batch we applied")
            try:
                self._replay_into(0, until=None)  # the new server's history
            except ReplayFailed as e:
                self.update(error=str(e))
            return
        self._deliver(frames[1:], until=None)

    def _restarted(self, why: str) -> None:
        log.info("KV events %s: server restarted (%s)", self.endpoint, why)
        self.bump("restarts", error=f"server restarted: {why}")
        self._expected = 0
        self._last_live = None
        self._last_payload = None
        self.update(first_seq=None)
        self._emit(RESTART_SEQ, EventBatch(ts=time.time(), events=[AllBlocksCleared()]))

    def _fill(self, upto: int) -> None:
        """Seqs _expected .. upto-1 from the replay socket (and whatever follows them)."""
        if self._replay is None or not self._replay.ready():
            return
        try:
            self._replay_into(self._expected or 0, until=None)
        except ReplayFailed as e:
            self.update(error=str(e))

    def _replay_into(self, start: int, until: int | None) -> None:
        assert self._replay is not None  # each caller returned early without a replay socket
        self._deliver(self._replay.request(start), until)

    def _deliver(self, frames: list[tuple[int, bytes]], until: int | None) -> None:
        for seq, payload in frames:
            if until is not None and seq >= until:
                break
            if not seq < MAX_SEQ:
                self.bump("malformed", error=f"a replayed frame with seq {seq}")
                return
            if self._expected is None:
                self._expected = seq  # the oldest batch the server still buffers
                self._missed_before(seq)
            if seq < self._expected:
                continue
            if seq > self._expected:
                self.bump("missed", seq - self._expected)
            self._apply(seq, payload)
            self.bump("recovered")

    def _missed_before(self, first: int) -> None:
        """The stream starts at `first`: the batches 0..first-1 of this publisher are lost."""
        if first > 0:
            self.bump("missed", first, error=f"joined at seq {first}; older batches are gone")

    def _apply(self, seq: int, payload: bytes) -> None:
        self._expected = seq + 1
        self._last_payload = payload
        if self.status().first_seq is None:
            self.update(first_seq=seq)
        steps = decoding(payload, self.pool_blocks)
        try:
            while True:
                next(steps)
                if self.stopping():
                    return  # the stream ends: the rest of this frame is not wanted
        except StopIteration as done:
            batch = done.value
        except MalformedFrame as e:
            self._malformed(f"seq {seq}: {e}")
            return
        self._emit(seq, batch)

    def _malformed(self, error: str) -> None:
        self.bump("malformed", error=error)
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning("KV events %s: a malformed frame, not applied: %s", self.endpoint, error)

    def _emit(self, seq: int, batch: EventBatch) -> None:
        try:
            self.on_batch(seq, batch)
        except Exception as e:  # the consumer's bug must not end the stream
            log.exception("KV subscriber on_batch callback failed")
            self.update(error=f"on_batch failed at seq {seq}: {e}")
        if seq < 0:
            return
        status = self.status()
        changes = {"last_seq": seq, "batches": status.batches + 1}
        if status.first_seq != seq and any(isinstance(e, AllBlocksCleared) for e in batch.events):
            changes["resets"] = status.resets + 1
        self.update(**changes)
