"""Ask a vLLM-style replay socket for the KV event batches we missed.

vLLM 0.33's publisher (vllm/distributed/kv_events.py, ZmqEventPublisher._service_replay) binds
a ROUTER. A DEALER sends (b"", start seq as 8 bytes big-endian); the answer is one message per
buffered batch from that seq, (b"", topic, seq, payload), then the end marker
(b"", b"", -1 as 8 bytes, b""). KVScope servers before they matched vLLM left the topic out,
(b"", seq, payload) and (b"", -1, b""): both are read.

An answer is bounded, because the peer may be broken or hostile: at most `max_frames` batches
and `max_bytes` of payload, within `total_s` seconds in all and `gap_s` between two messages;
seqs must rise from the start seq. Past any bound the request fails (ReplayFailed), the DEALER
is replaced so that a late answer cannot pass for the next one's, and later requests back off
(doubling from `backoff[0]` to `backoff[1]`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import zmq

END_SEQ = -1
POLL_S = 0.05


class ReplayFailed(Exception):
    """The replay socket did not answer in time, or its answer broke a bound."""


class ReplayClient:
    def __init__(
        self,
        make_socket: Callable[[], zmq.Socket],
        endpoint: str,
        on_malformed: Callable[[str], None],
        stopping: Callable[[], bool],
        backoff: tuple[float, float] = (0.5, 10.0),
        gap_s: float = 2.0,
        total_s: float = 30.0,
        max_frames: int = 100_000,
        max_bytes: int = 512 << 20,
    ) -> None:
        self._make_socket = make_socket
        self.endpoint = endpoint
        self._on_malformed = on_malformed
        self._stopping = stopping
        self.backoff = backoff
        self.gap_s, self.total_s = gap_s, total_s
        self.max_frames, self.max_bytes = max_frames, max_bytes
        self._dealer: zmq.Socket | None = None
        self._delay = backoff[0]
        self._after = 0.0  # monotonic; requests wait for this after a failure

    def ready(self) -> bool:
        """False while backing off after a failed request."""
        return time.monotonic() >= self._after

    def close(self) -> None:
        if self._dealer is not None:
            self._dealer.close(linger=0)
            self._dealer = None

    def request(self, start: int) -> list[tuple[int, bytes]]:
        """Every buffered batch from `start`, [(seq, payload)] in seq order."""
        if self._dealer is None:
            self._dealer = self._make_socket()
        dealer = self._dealer
        try:
            dealer.send_multipart((b"", start.to_bytes(8, "big")), zmq.NOBLOCK)
            frames = self._read(dealer, start)
            self._delay = self.backoff[0]
            return frames
        except (ReplayFailed, zmq.ZMQError) as e:
            self.close()
            self._after = time.monotonic() + self._delay
            self._delay = min(self._delay * 2, self.backoff[1])
            if isinstance(e, ReplayFailed):
                raise
            raise ReplayFailed(f"replay {self.endpoint}: {e}") from None

    def _read(self, dealer: zmq.Socket, start: int) -> list[tuple[int, bytes]]:
        frames: list[tuple[int, bytes]] = []
        size = 0
        began = time.monotonic()
        gap_deadline = began + self.gap_s
        while not self._stopping():
            now = time.monotonic()
            if now - began > self.total_s:
                raise ReplayFailed(
                    f"replay {self.endpoint} did not finish within {self.total_s:g} s "
                    f"({len(frames)} batches so far)"
                )
            if not dealer.poll(int(POLL_S * 1000)):
                if time.monotonic() > gap_deadline:
                    raise ReplayFailed(
                        f"replay {self.endpoint} gave no answer within {self.gap_s:g} s"
                    )
                continue
            parts = dealer.recv_multipart()
            gap_deadline = time.monotonic() + self.gap_s
            parsed = _parse(parts)
            if parsed is None:
                self._on_malformed(f"a replay frame of {len(parts)} parts")
                continue
            seq, payload = parsed
            if seq == END_SEQ:
                return frames
            if seq < start or (frames and seq <= frames[-1][0]):
                raise ReplayFailed(
                    f"replay {self.endpoint} sent seq {seq} out of order (asked from {start})"
                )
            size += len(payload)
            frames.append((seq, payload))
            if len(frames) > self.max_frames or size > self.max_bytes:
                raise ReplayFailed(
                    f"replay {self.endpoint} sent over {self.max_frames} batches or "
                    f"{self.max_bytes >> 20} MiB without ending"
                )
        raise ReplayFailed("stopped during a replay")


def _parse(parts: list[bytes]) -> tuple[int, bytes] | None:
    """(seq, payload) of one replay message, the end marker as (END_SEQ, b""); None if neither
    vLLM's (b"", topic, seq, payload) nor the older topic-less (b"", seq, payload)."""
    if len(parts) == 4 and parts[0] == b"" and len(parts[2]) == 8:
        seq_bytes, payload = parts[2], parts[3]
    elif len(parts) == 3 and parts[0] == b"" and len(parts[1]) == 8:
        seq_bytes, payload = parts[1], parts[2]
    else:
        return None
    seq = int.from_bytes(seq_bytes, "big", signed=True)
    if seq < 0:
        return (END_SEQ, b"") if seq == END_SEQ else None
    return seq, payload
