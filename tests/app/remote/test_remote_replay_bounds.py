"""A replay socket that is broken or hostile cannot grow the subscriber without bound or stall
its stream: an answer is bounded in batches, bytes and time, seqs must rise, and one absurd seq
does not make every later batch look old."""

from __future__ import annotations

import threading
import time

import zmq
from remote_fakes import FakeKVServer, wait_until
from served import free_endpoint
from subscriber_checks import Recorder, payload, stop_promptly

from kvscope.app.remote.kv_replay import ReplayClient, ReplayFailed
from kvscope.app.remote.kv_stream import MAX_SEQ
from kvscope.app.remote.kv_subscriber import KVEventSubscriber


class HostileReplay:
    """A ROUTER answering every request with `answer(start)`'s messages (after the identity
    and the empty delimiter), forever if it says so: one per test, since an endless answer
    keeps its thread."""

    def __init__(self, answer) -> None:
        self.endpoint = free_endpoint()
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(self.endpoint)
        self.answer = answer
        self.running = True
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.running:
            if not self.router.poll(20):
                continue
            client, _, start = self.router.recv_multipart()
            for frames in self.answer(int.from_bytes(start, "big")):
                if not self.running:
                    break
                self.router.send_multipart([client, b"", *frames])

    def close(self) -> None:
        self.running = False
        self.thread.join(2)
        self.ctx.destroy(linger=0)


def client_for(server: HostileReplay, ctx: zmq.Context, malformed: list, **bounds) -> ReplayClient:
    def make():
        sock = ctx.socket(zmq.DEALER)
        sock.connect(server.endpoint)
        return sock

    return ReplayClient(make, server.endpoint, malformed.append, lambda: False, **bounds)


def endless(start: int):
    seq = start
    while True:
        yield [seq.to_bytes(8, "big"), b"x" * 1000]
        seq += 1


def test_an_answer_that_never_ends_is_cut_by_frames_bytes_and_time():
    for bounds, why in (
        ({"max_frames": 500}, "over 500 batches"),
        ({"max_bytes": 200_000}, "without ending"),
        ({"total_s": 0.5, "max_frames": 10**9, "max_bytes": 10**12}, "within 0.5 s"),
    ):
        server, ctx = HostileReplay(endless), zmq.Context()
        try:
            malformed: list = []
            client = client_for(server, ctx, malformed, **bounds)
            began = time.monotonic()
            try:
                client.request(0)
            except ReplayFailed as e:
                assert why in str(e)
            else:
                raise AssertionError("an endless replay answer was accepted")
            assert time.monotonic() - began < 10 and not malformed
            assert not client.ready()  # backs off before asking again
            client.close()
        finally:
            server.close()
            ctx.destroy(linger=0)


def test_seqs_must_rise_and_both_answer_layouts_are_read():
    def answer(start):
        yield [(5).to_bytes(8, "big"), b"a"]  # the topic-less layout of older servers
        yield [b"kv", (6).to_bytes(8, "big"), b"b"]  # vLLM 0.33's
        yield [b"junk"]  # neither
        yield [b"", (-1).to_bytes(8, "big", signed=True), b""]

    server, ctx = HostileReplay(answer), zmq.Context()
    try:
        malformed: list = []
        assert client_for(server, ctx, malformed).request(5) == [(5, b"a"), (6, b"b")]
        assert len(malformed) == 1
        try:
            client_for(server, ctx, malformed).request(6)  # seq 5 is below the start
        except ReplayFailed as e:
            assert "out of order" in str(e)
        else:
            raise AssertionError("a replayed seq below the start was accepted")
    finally:
        server.close()
        ctx.destroy(linger=0)


def test_one_absurd_seq_does_not_hide_the_live_stream():
    server, rec = FakeKVServer(), Recorder()
    sub = KVEventSubscriber(server.pub_endpoint, server.replay_endpoint, on_batch=rec.on_batch)
    try:
        server.publish(payload(0), live=False)
        server.buffer.append((10**15, payload(1)))  # absurd, after a real batch
        sub.start()
        wait_until(lambda: rec.seqs == [0], what="the real history")
        assert 10**15 >= MAX_SEQ
        server.send_raw([b"", (10**15 + 1).to_bytes(8, "big"), payload(2)])  # live, absurd too
        wait_until(lambda: sub.status().connected, what="a connection")
        last = wait_until(
            lambda: (server.publish(payload(3)), rec.seqs[-1] > 0 and rec.seqs)[1],
            what="a live batch after the absurd ones",
        )
        assert last[-1] < MAX_SEQ and sub.status().malformed >= 2
    finally:
        stop_promptly(sub)
        server.close()
