"""A RemoteView over fake replica monitors: two replicas, one up with metrics and one down after
a restart, for the remote view's tests and the themes' (tests/app/desktop/conftest.py makes
`two_replicas` a fixture there)."""

from __future__ import annotations

import threading
import time

import pytest

from kvscope.app.desktop.remote_view import RemoteView
from kvscope.app.remote.connection import parse_connection
from kvscope.app.remote.connections_qt import ConnectionList
from kvscope.app.remote.kv_subscriber import SubscriberStatus
from kvscope.app.remote.kv_wire import AllBlocksCleared, BlockStored, EventBatch
from kvscope.app.remote.metrics_scrape import parse_metrics
from kvscope.app.remote.monitor import ReplicaSnapshot
from kvscope.app.remote.remote_cache import RemoteCache

A, B = "gpu-a:8000", "gpu-b:8000"
BS = 16
SYSTEM = list(range(1000, 1000 + 40 * BS))  # a 40-block shared system prompt


def stored(hashes: list[int], parent: int | None, tokens: list[int]) -> EventBatch:
    return EventBatch(time.time(), [BlockStored(hashes, parent, tokens, BS)])


def tokens(start: int, blocks: int) -> list[int]:
    return list(range(start, start + blocks * BS))


def replica_caches() -> tuple[RemoteCache, RemoteCache]:
    """A holds the system prompt and two conversations under it; B (other hash seed, so other
    hashes) holds the prompt's first 10 blocks, an unrelated prompt and an orphan pair."""
    now = time.time()
    a, b = RemoteCache(A), RemoteCache(B)
    a.apply(stored(list(range(1, 41)), None, SYSTEM), now - 90)
    a.apply(stored(list(range(41, 47)), 40, tokens(5000, 6)), now - 60)
    a.apply(stored(list(range(47, 50)), 40, tokens(6000, 3)), now - 30)
    b.apply(stored(list(range(101, 111)), None, SYSTEM[: 10 * BS]), now - 70)
    b.apply(stored(list(range(111, 131)), None, tokens(9000, 20)), now - 60)
    b.apply(stored([131, 132], 5555, tokens(7000, 2)), now - 50)
    return a, b


def metrics_text(usage: float, running: int, hits: int, queries: int, gen: int, ttft: float):
    return f"""\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="tiny",engine="0"}} {usage}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="tiny",engine="0"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="tiny",engine="0"}} 1
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{{model_name="tiny",engine="0"}} 2
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{model_name="tiny",engine="0"}} {queries}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{model_name="tiny",engine="0"}} {hits}
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{{model_name="tiny",engine="0"}} {gen}
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{model_name="tiny",engine="0",le="1.0"}} {running}
vllm:time_to_first_token_seconds_bucket{{model_name="tiny",engine="0",le="+Inf"}} {running}
vllm:time_to_first_token_seconds_count{{model_name="tiny",engine="0"}} {running}
vllm:time_to_first_token_seconds_sum{{model_name="tiny",engine="0"}} {ttft * running}
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="{BS}",num_gpu_blocks="400"}} 1.0
"""


def status(state: str, **changes) -> SubscriberStatus:
    fields = dict(state=state, last_seq=812, recovered=3, missed=0, malformed=0, restarts=0)
    fields.update(error="", since=time.time() - 5)
    fields.update(changes)
    return SubscriberStatus(**fields)


def snapshot(connection, cache, status_, http_state="up", http_error="", metrics=()):
    history = [(m.scraped_at, m) for m in metrics]
    return ReplicaSnapshot(
        connection=connection,
        status=status_,
        http_state=http_state,
        http_error=http_error,
        metrics=history[-1][1] if history else None,
        metrics_history=history,
        cache=cache,
        block_size=BS,
        model="tiny",
    )


class FakeMonitor:
    """What the view needs of a ReplicaMonitor, serving snapshots the test sets."""

    def __init__(self, connection, snapshots: dict) -> None:
        self.connection = connection
        self._snapshots = snapshots
        self.stopped = threading.Event()

    def snapshot(self):
        return self._snapshots[self.connection.label]

    def stop(self) -> None:
        self.stopped.set()


@pytest.fixture()
def two_replicas(qtbot):
    """A RemoteView over two fake monitors: A up with metrics, B down after a restart."""
    conn_a = parse_connection("http://gpu-a:8000", "tcp://gpu-a:5557", "tcp://gpu-a:5558")
    conn_b = parse_connection("http://gpu-b:8000", "tcp://gpu-b:5557")
    a, b = replica_caches()
    now = time.time()
    scrapes = [
        parse_metrics(metrics_text(0.2, 2, 100, 400, 1000, 0.08), now=now - 12),
        parse_metrics(metrics_text(0.25, 3, 700, 1400, 1600, 0.1), now=now - 1),
    ]
    b.apply(EventBatch(now, [AllBlocksCleared()]), now - 40)  # B restarted: cache cleared
    b.apply(stored(list(range(201, 206)), None, SYSTEM[: 5 * BS]), now - 35)
    b.apply(stored(list(range(211, 231)), None, tokens(9000, 20)), now - 20)
    error = "ConnectError: [Errno 111] Connection refused"
    snaps = {
        A: snapshot(conn_a, a, status("live"), metrics=scrapes),
        B: snapshot(
            conn_b,
            b,
            status("connecting", restarts=1, malformed=2, error="connection lost"),
            http_state="down",
            http_error=error,
        ),
    }
    connections = ConnectionList()
    monitors: list[FakeMonitor] = []

    def factory(connection):
        monitors.append(FakeMonitor(connection, snaps))
        return monitors[-1]

    view = RemoteView(connections, monitor_factory=factory, tokenize=None)
    qtbot.addWidget(view)
    connections.add(conn_a)
    connections.add(conn_b)
    view.resize(1024, 700)
    view.show()
    qtbot.waitExposed(view)
    view.poll()
    qtbot.waitUntil(view.tree_settled)  # merged in a worker thread
    yield view, connections, snaps, monitors
    view.shutdown()
