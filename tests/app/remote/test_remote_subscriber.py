"""The KV event subscriber when things go wrong: malformed frames, a replay socket that never
answers, a server that goes quiet, goes away, or restarts counting from 0; stop() in every
state. And once against a real `kvscope serve` Server, whose cached blocks it must rebuild."""

from __future__ import annotations

import time

import httpx
import pytest
from remote_fakes import FakeKVServer, free_endpoint, wait_until
from served import engine_event_hashes, start_server
from subscriber_checks import Recorder, payload, stop_promptly  # noqa: F401

from kvscope.app.remote.kv_stream import RESTART_SEQ
from kvscope.app.remote.kv_subscriber import KVEventSubscriber
from kvscope.app.remote.kv_wire import AllBlocksCleared
from kvscope.app.remote.remote_cache import RemoteCache


def subscriber(server: FakeKVServer, rec: Recorder, **options) -> KVEventSubscriber:
    options.setdefault("backoff", (0.05, 0.2))
    return KVEventSubscriber(
        server.pub_endpoint,
        server.replay_endpoint,
        on_batch=rec.on_batch,
        on_status=rec.on_status,
        **options,
    )


def test_malformed_frames_are_counted_and_the_stream_goes_on():
    server, rec = FakeKVServer(), Recorder()
    sub = subscriber(server, rec).start()
    try:
        wait_until(lambda: sub.status().connected, what="a connection")
        server.publish(payload(0))  # a live frame may be lost to ZMQ's slow joiner...
        wait_until(lambda: rec.seqs == [0], what="seq 0")  # ...then the replay brings it
        server.send_raw([b"", b"\x00\x01"])  # two parts, not three
        server.send_raw([b"", b"\x00" * 3, b"x"])  # seq of 3 bytes
        server.publish(b"\xc1not msgpack")  # seq 1: consumed, not applied
        server.publish(payload(2))
        wait_until(lambda: rec.seqs == [0, 2], what="seq 2 after the bad frames")
        status = sub.status()
        assert status.malformed == 3 and status.missed == 0
        assert "seq 1" in status.error and "not msgpack" in status.error
        assert status.last_seq == 2
    finally:
        stop_promptly(sub)
        server.close()


def test_a_frame_over_the_size_limit_drops_the_link_not_the_process(monkeypatch):
    """A peer announcing a frame over MAX_FRAME_BYTES: ZMQ drops that connection instead of
    this process allocating it, the subscriber reconnects, and later batches arrive."""
    from kvscope.app.remote import kv_subscriber

    monkeypatch.setattr(kv_subscriber, "MAX_FRAME_BYTES", 4096)  # the limit, made small
    server, rec = FakeKVServer(), Recorder()
    sub = subscriber(server, rec).start()
    try:
        wait_until(lambda: sub.status().connected, what="a connection")
        server.publish(payload(0))
        wait_until(lambda: rec.seqs == [0], what="seq 0")
        server.send_raw([b"", (1).to_bytes(8, "big"), b"\x00" * 8192])  # over the limit
        time.sleep(0.5)  # ZMQ drops the link, then reconnects after the backoff
        wait_until(lambda: sub.status().connected, what="a connection again", timeout=20)
        server.next_seq = 1  # the oversized frame was seq 1, never buffered: seq 1 is anew

        def later_arrives() -> bool:
            server.publish(payload(server.next_seq))  # a live frame may meet a slow joiner
            return rec.seqs[-1] >= 3

        wait_until(later_arrives, what="batches after the dropped frame", timeout=20)
        assert rec.seqs[:2] == [0, 1], rec.seqs  # what came after, in order
        assert sub.alive()
    finally:
        stop_promptly(sub)
        server.close()


def test_a_replay_that_never_answers_times_out_and_the_gap_is_counted():
    server, rec = FakeKVServer(answer_replay=False), Recorder()
    sub = subscriber(server, rec, replay_timeout_s=0.3).start()
    try:
        wait_until(lambda: "no answer" in sub.status().error, what="the first replay to time out")
        time.sleep(0.2)  # past the replay backoff (0.05 s), and the subscription is through
        server.publish(payload(0))
        wait_until(lambda: rec.seqs == [0], what="seq 0 live")
        server.publish(payload(1), live=False)
        server.publish(payload(2))
        wait_until(lambda: rec.seqs == [0, 2], what="seq 2 despite the silent replay")
        status = sub.status()
        assert status.missed == 1 and status.recovered == 0
        assert "no answer within 0.3 s" in status.error
        assert len(server.replay_requests) >= 2  # the history at connect, then the gap
    finally:
        stop_promptly(sub)
        server.close()


def test_quiet_then_gone_then_back():
    pub, replay = free_endpoint(), free_endpoint()
    server, rec = FakeKVServer(pub, replay), Recorder()
    sub = subscriber(server, rec, silent_after_s=0.3).start()
    try:
        wait_until(lambda: sub.status().state == "live", what="live")
        # Connected, but nothing comes: "silent" (an idle server looks the same).
        wait_until(lambda: sub.status().state == "silent", what="silent")
        assert sub.status().connected
        server.publish(payload(0))
        wait_until(lambda: rec.seqs == [0], what="seq 0")
        server.close()  # the server goes away
        wait_until(lambda: sub.status().state == "connecting", what="the loss noticed")
        assert "lost" in sub.status().error and not sub.status().connected
        # ZMQ retries with backoff; the same server (same history) comes back.
        server = FakeKVServer(pub, replay)
        server.publish(payload(0))
        server.publish(payload(1))
        wait_until(lambda: rec.seqs == [0, 1], what="seq 1 after the reconnect")
        assert sub.status().restarts == 0  # seq 0 matched what we had applied
        states = [s.state for s in rec.statuses]
        assert {"live", "silent", "connecting"} <= set(states)
        assert any(s.retry_at is not None for s in rec.statuses)
    finally:
        stop_promptly(sub)
        server.close()


def test_joining_late_a_bounded_buffer_and_no_replay_at_all():
    server, rec = FakeKVServer(), Recorder()
    for seq in range(5):
        server.publish(payload(seq), live=False)
    del server.buffer[:3]  # vLLM's buffer is bounded: seqs 0-2 are gone
    sub = subscriber(server, rec).start()
    try:
        wait_until(lambda: rec.seqs == [3, 4], what="what the buffer still holds")
        status = sub.status()
        # Seqs 0-2 are lost for good, and counted so.
        assert (status.first_seq, status.missed, status.recovered) == (3, 3, 2)
    finally:
        stop_promptly(sub)
    # Without a replay endpoint: the first live seq is where we start; gaps are lost.
    rec = Recorder()
    sub = KVEventSubscriber(server.pub_endpoint, None, on_batch=rec.on_batch).start()
    try:
        wait_until(lambda: sub.status().connected, what="a connection")
        wait_until(lambda: (server.publish(payload(server.next_seq)), rec.seqs)[1], what="a seq")
        first = rec.seqs[0]
        server.publish(payload(0), live=False)  # lost
        last = server.publish(payload(0))
        wait_until(lambda: rec.seqs[-1] == last, what="the seq after the gap")
        status = sub.status()
        # What came before the first live seq, and the gap.
        assert status.first_seq == first and status.missed == first + 1 and not status.replay
    finally:
        stop_promptly(sub)
        server.close()


@pytest.mark.parametrize("catch_up", [False, True])
def test_a_restarted_server_clears_the_cache(catch_up):
    """The new server counts from 0 again. Either its first live seq is below ours (seq going
    back), or it has caught up past ours before we reconnect: then the bytes at our last seq
    differ from what we applied (checked on reconnecting)."""
    pub, replay = free_endpoint(), free_endpoint()
    server, rec = FakeKVServer(pub, replay), Recorder()
    cache = RemoteCache("r")

    def on_batch(seq, batch):
        rec.on_batch(seq, batch)
        cache.apply(batch, time.time())

    sub = KVEventSubscriber(pub, replay, on_batch=on_batch, backoff=(0.05, 0.2)).start()
    try:
        wait_until(lambda: sub.status().connected, what="a connection")
        for seq in range(3):
            server.publish(payload(seq))
        wait_until(lambda: rec.seqs == [0, 1, 2], what="the first server's seqs")
        assert cache.num_blocks == 3
        server.close()
        wait_until(lambda: not sub.status().connected, what="the loss noticed")
        server = FakeKVServer(pub, replay)
        new = (["BlockStored", [5000 + s], None, [7] * 4, 4, None, "GPU", None] for s in range(10))
        count = 5 if catch_up else 1
        for seq in range(count):
            server.publish(payload(seq, next(new)), live=False)  # before we are back
        wait_until(lambda: sub.status().restarts == 1, what="the restart detected")
        server.publish(payload(count, next(new)))
        wait_until(lambda: rec.seqs[-1] == count, what="the new server's live seq")
        seqs = rec.seqs
        restart_at = seqs.index(RESTART_SEQ)
        assert seqs[:restart_at] == [0, 1, 2]
        assert seqs[restart_at + 1 :] == list(range(count + 1))
        assert rec.batches[restart_at][1].events == [AllBlocksCleared()]
        # Only the new server's blocks remain.
        assert {h for _, h in cache.blocks} == {5000 + s for s in range(count + 1)}
        assert cache.clears == 1 and "restarted" in sub.status().error
    finally:
        stop_promptly(sub)
        server.close()


def test_stop_is_prompt_in_every_state():
    # Nothing listens at all: connecting, ZMQ retrying with a doubling interval up to the cap.
    rec = Recorder()
    nowhere = KVEventSubscriber(
        free_endpoint(), free_endpoint(), on_status=rec.on_status, backoff=(0.05, 0.2)
    ).start()
    wait_until(lambda: [s.retry_in_s for s in rec.statuses].count(0.2) >= 2, what="the cap")
    intervals = [s.retry_in_s for s in rec.statuses if s.retry_in_s is not None]
    assert intervals[:4] == [0.05, 0.1, 0.2, 0.2]
    assert (
        nowhere.status().state == "connecting"
        and "not reached yet; retrying in" in nowhere.status().error
    )
    stop_promptly(nowhere)
    # Mid-replay, with a replay socket that will never answer and a long timeout.
    server = FakeKVServer(answer_replay=False)
    stuck = KVEventSubscriber(
        server.pub_endpoint, server.replay_endpoint, replay_timeout_s=60
    ).start()
    try:
        wait_until(lambda: server.replay_requests, what="the replay request")
        stop_promptly(stuck)
    finally:
        server.close()
    with pytest.raises(ValueError, match="backoff"):
        KVEventSubscriber("tcp://127.0.0.1:1", backoff=(2.0, 1.0))


def test_against_a_real_kvscope_server(default_model):
    """`kvscope serve`'s publisher: the rebuilt cache holds exactly the engine's blocks, under
    vLLM's hashes of their token chains."""
    srv = start_server(default_model, 32, kv_events=True)
    pub, replay = srv.kv_endpoints
    cache = RemoteCache("kvscope")
    sub = KVEventSubscriber(pub, replay, on_batch=lambda s, b: cache.apply(b, time.time()))
    try:
        # Traffic first: the subscriber joins late and must get everything from the replay.
        prompt = srv.driver.engine.tokenizer.encode("Tell me about the sea and its tides. " * 6)
        body = {"model": srv.model_name, "prompt": prompt, "max_tokens": 2}
        reply = httpx.post(f"{srv.base_url}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        sub.start()

        # vLLM's sha256 hashes of each cached block's token chain (what vLLM would announce).
        expected = engine_event_hashes(srv)
        assert len(expected) >= 3
        wait_until(lambda: {h for _, h in cache.blocks} == expected, what="the engine's blocks")
        assert cache.block_size == 16 and sub.status().recovered >= 2
        # The prompt's leading blocks are there by token content too (routing's fallback).
        assert cache.held_prefix_blocks(prompt, 16) == len(prompt) // 16
    finally:
        sub.stop()
        srv.stop()
