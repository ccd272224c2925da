"""A KV-event subscriber under test: a recorder of what it delivers, event batches as a publisher
frames them, and a stop that must be prompt."""

from __future__ import annotations

import threading

import msgspec

from kvscope.app.remote.kv_subscriber import KVEventSubscriber


def payload(seq: int, *events) -> bytes:
    """A batch in vLLM's array layout, built by hand: [ts, [event...], dp_rank]."""
    events = events or (["BlockStored", [1000 + seq], None, [seq] * 4, 4, None, "GPU", None],)
    return msgspec.msgpack.encode([float(seq), list(events), 0])


class Recorder:
    def __init__(self) -> None:
        self.batches: list[tuple[int, object]] = []
        self.statuses: list = []
        self.lock = threading.Lock()

    def on_batch(self, seq, batch) -> None:
        with self.lock:
            self.batches.append((seq, batch))

    def on_status(self, status) -> None:
        self.statuses.append(status)

    @property
    def seqs(self) -> list[int]:
        with self.lock:
            return [s for s, _ in self.batches]


def stop_promptly(sub: KVEventSubscriber) -> None:
    sub.stop(timeout=2)
    assert not sub._thread.is_alive(), "stop() left the thread running"
    assert sub.status().state == "stopped"
