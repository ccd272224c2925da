"""A hostile vLLM-like peer for `kvscope bench --soak`: what a broken or malicious replica sends
the remote view, from one process, bounded in rate and time.

- HTTP (/metrics, /v1/models): pages trickled a byte at a time, pages over the size caps, values
  no vLLM sends (block_size="inf", a pool of 10^12 blocks), model ids that are objects;
- KV events (a PUB socket, vLLM's frames: topic, 8-byte seq, msgpack batch): valid chains of
  blocks, garbage payloads, wrong frame counts, absurd seqs (2^50), seqs that go back, events with
  absurd block sizes or groups, and big batches (20,000 BlockStored);
- replay (a ROUTER socket): answers that never send their end marker, trickled, and replayed seqs
  that do not rise.

Every sender is bounded: batches per second, bytes per batch, seconds per HTTP answer and per
replay answer, so the peer itself cannot run away whatever the client does."""

from __future__ import annotations

import itertools
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgspec
import zmq

PUBLISH_EVERY_S = 0.1
BIG_BATCH_BLOCKS = 20_000
BIG_BATCH_EVERY = 50  # one big batch per 50 published (every ~5 s)
TRICKLE_BYTE_S = 0.5  # one byte of a trickled page every half second
HTTP_ANSWER_CAP_S = 30.0  # however slowly the client reads, an answer ends by then
REPLAY_ANSWER_CAP_S = 10.0
REPLAY_ANSWER_CAP_FRAMES = 20_000
BLOCK_SIZE = 16
ABSURD_SEQ = 1 << 50

_GOOD_METRICS = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="hostile"} 1\n'
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    'vllm:kv_cache_usage_perc{model_name="hostile"} 0.5\n'
)
_BAD_VALUES = (
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="inf",num_gpu_blocks="1000000000000",'
    'prefix_caching_hash_algo="sha256"} 1\n'
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="hostile"} NaN\n'
)


def _metrics_pages():
    """What /metrics answers, in turn: (body, trickled)."""
    return itertools.cycle(
        [
            (_GOOD_METRICS.encode(), False),
            (_BAD_VALUES.encode(), False),
            (_GOOD_METRICS.encode(), True),  # a byte every TRICKLE_BYTE_S
            (b"# TYPE x gauge\n" + b"x 1\n" * (9 << 18), False),  # ~9 MiB: over the 8 MiB cap
            (b"\x00\xff not prometheus {{{\n" * 100, False),
        ]
    )


def _models_pages():
    return itertools.cycle(
        [
            b'{"object": "list", "data": [{"id": {"an": "object"}}, {"id": 7}]}',
            b'{"object": "list", "data": [{"id": "' + b"m" * (2 << 20) + b'"}]}',  # over 1 MiB
            b"[" * 100_000,  # nesting deep enough to break a recursive parser
            b'{"object": "list", "data": [{"id": "hostile"}]}',
        ]
    )


class HostilePeer:
    """Start with `start()`; `url`, `pub_endpoint`, `replay_endpoint` for a Connection."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._metrics, self._models = _metrics_pages(), _models_pages()
        self._pages_lock = threading.Lock()
        self.counts = {"batches": 0, "bad_frames": 0, "big_batches": 0, "replays": 0, "pages": 0}
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 1000)  # a slow subscriber drops frames, we never block
        port = self._pub.bind_to_random_port("tcp://127.0.0.1")
        self.pub_endpoint = f"tcp://127.0.0.1:{port}"
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        port = self._router.bind_to_random_port("tcp://127.0.0.1")
        self.replay_endpoint = f"tcp://127.0.0.1:{port}"
        self._threads = [
            threading.Thread(target=self._http.serve_forever, name="peer-http", daemon=True),
            threading.Thread(target=self._publish_loop, name="peer-pub", daemon=True),
            threading.Thread(target=self._replay_loop, name="peer-replay", daemon=True),
        ]

    def start(self) -> HostilePeer:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._http.shutdown()
        self._http.server_close()
        for t in self._threads:
            t.join(timeout=5)
        self._pub.close()
        self._router.close()
        self._ctx.term()

    # ---- HTTP ----------------------------------------------------------------------------
    def _next_page(self, path: str) -> tuple[bytes, bool] | None:
        with self._pages_lock:
            self.counts["pages"] += 1
            if path == "/metrics":
                return next(self._metrics)
            if path == "/v1/models":
                return next(self._models), False
        return None

    def _handler_class(self):
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # a hostile peer has nothing to say
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                page = peer._next_page(self.path)
                if page is None:
                    self.send_error(404)
                    return
                body, trickled = page
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    if trickled:
                        peer._trickle(self.wfile, body)
                    else:
                        self.wfile.write(body)
                except OSError:  # the client gave up on us: as intended
                    pass

        return Handler

    def _trickle(self, wfile, body: bytes) -> None:
        deadline = time.monotonic() + HTTP_ANSWER_CAP_S
        for i in range(len(body)):
            if self._stop.is_set() or time.monotonic() > deadline:
                return
            wfile.write(body[i : i + 1])
            wfile.flush()
            self._stop.wait(TRICKLE_BYTE_S)

    # ---- KV events -----------------------------------------------------------------------
    def _stored(self, n: int, parent: int | None) -> list[dict]:
        events = []
        for _ in range(n):
            h = self._rng.getrandbits(63)
            tokens = [self._rng.randrange(50_000) for _ in range(BLOCK_SIZE)]
            events.append(
                {
                    "type": "BlockStored",
                    "block_hashes": [h],
                    "parent_block_hash": parent,
                    "token_ids": tokens,
                    "block_size": BLOCK_SIZE,
                }
            )
            parent = h
        return events

    def _batch(self, events: list) -> bytes:
        return msgspec.msgpack.encode([time.time(), events, None])

    def _frames(self, k: int, seq: int) -> list[list[bytes]]:
        """The frames of publish round k: usually one valid batch, sometimes hostile ones."""
        good = [b"", seq.to_bytes(8, "big"), self._batch(self._stored(4, None))]
        kind = k % 10
        if k % BIG_BATCH_EVERY == BIG_BATCH_EVERY - 1:
            self.counts["big_batches"] += 1
            return [
                [b"", seq.to_bytes(8, "big"), self._batch(self._stored(BIG_BATCH_BLOCKS, None))]
            ]
        if kind == 3:
            return [good, [b"", (seq + 1).to_bytes(8, "big"), b"\xc1 not msgpack"]]
        if kind == 5:
            return [good, [b"only one frame"], [b"", b"\x00", b"", b"four"]]
        if kind == 7:
            absurd = self._stored(1, None)[0] | {"block_size": 10**7, "group_idx": -3}
            return [good, [b"", ABSURD_SEQ.to_bytes(8, "big"), self._batch([absurd])]]
        if kind == 9:  # a seq that goes back: a "restart" every 10 rounds
            return [[b"", max(0, seq - 5).to_bytes(8, "big"), self._batch(self._stored(2, None))]]
        return [good]

    def _publish_loop(self) -> None:
        seq = 0
        for k in itertools.count():
            if self._stop.wait(PUBLISH_EVERY_S):
                return
            for frames in self._frames(k, seq):
                try:
                    self._pub.send_multipart(frames, flags=zmq.NOBLOCK)
                except zmq.Again:  # the high-water mark: the subscriber is behind; drop
                    pass
                self.counts["batches"] += 1
                self.counts["bad_frames"] += len(frames) != 3
            seq += 2

    def _replay_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                continue
            self.counts["replays"] += 1
            self._answer_replay(frames[0], self.counts["replays"])

    def _answer_replay(self, client: bytes, n: int) -> None:
        """Never the end marker: frames until our own caps, falling seqs every other answer."""
        deadline = time.monotonic() + REPLAY_ANSWER_CAP_S
        payload = self._batch(self._stored(1, None))
        for i in range(REPLAY_ANSWER_CAP_FRAMES):
            if self._stop.is_set() or time.monotonic() > deadline:
                return
            seq = (REPLAY_ANSWER_CAP_FRAMES - i) if n % 2 else i
            try:
                self._router.send_multipart(
                    (client, b"", b"", seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK
                )
            except zmq.Again:
                self._stop.wait(0.01)
            if i % 100 == 99:
                self._stop.wait(0.01)  # ~10k frames/s at most
