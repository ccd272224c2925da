"""A tiny KV event server for the remote tests: a PUB socket and a replay ROUTER speaking vLLM's
transport (vllm/distributed/kv_events.py: multipart (topic, seq 8 bytes big-endian, payload);
replay: (b"", start seq) -> (b"", seq, payload)..., (b"", -1, b"")), with the knobs a test
needs: publish a batch to the replay buffer only (a frame "lost" on the network), send raw
frames, not answer replays, stop and come back on the same endpoints."""

from __future__ import annotations

import threading
import time

import zmq
from served import free_endpoint  # noqa: F401 (the fakes' tests import it from here)

END = (-1).to_bytes(8, "big", signed=True)


def wait_until(condition, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class FakeKVServer:
    def __init__(
        self, pub: str | None = None, replay: str | None = None, answer_replay: bool = True
    ) -> None:
        self.pub_endpoint = pub or free_endpoint()
        self.replay_endpoint = replay or free_endpoint()
        self.answer_replay = answer_replay
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(self.pub_endpoint)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(self.replay_endpoint)
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_requests: list[int] = []
        self.next_seq = 0
        self._lock = threading.Lock()
        self._running = True
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    def publish(self, payload: bytes, live: bool = True, topic: bytes = b"") -> int:
        """Buffer the payload under the next seq; send it on PUB unless `live` is False."""
        with self._lock:
            seq = self.next_seq
            self.next_seq += 1
            self.buffer.append((seq, payload))
        if live:
            self.pub.send_multipart((topic, seq.to_bytes(8, "big"), payload))
        return seq

    def send_raw(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def _serve_replay(self) -> None:
        while self._running:
            if not self.router.poll(20):
                continue
            client, empty, start = self.router.recv_multipart()
            start_seq = int.from_bytes(start, "big")
            self.replay_requests.append(start_seq)
            if not self.answer_replay:
                continue
            with self._lock:
                frames = [(s, p) for s, p in self.buffer if s >= start_seq]
            # vLLM 0.33's answer: the topic (ours is "") in each batch, an empty one in the end
            # marker (tests/app/serve/test_vllm_kv_events.py runs vLLM's own publisher for the real
            # thing).
            for seq, payload in frames:
                self.router.send_multipart((client, b"", b"", seq.to_bytes(8, "big"), payload))
            self.router.send_multipart((client, b"", b"", END, b""))

    def close(self) -> None:
        self._running = False
        self._thread.join(2)
        self.pub.close(linger=0)
        self.router.close(linger=0)
        self.ctx.term()
