"""Watch one replica: its KV events into a RemoteCache, its /metrics polled over HTTP. Threads
only, no Qt: the GUI takes `snapshot()` on a timer, which copies under a lock and reuses the
last cache copy while nothing changed, so it stays cheap at 4 Hz.

The poller backs off exponentially (poll_s doubling up to BACKOFF_CAP_S) while the server does
not answer, and says why in `http_error` ("ConnectError: ...", "HTTP 401 from /metrics").
Requests use short timeouts, so `stop()` returns within about a second whatever the server
does.

A batch is applied a slice at a time (RemoteCache.applying), the lock let go between slices;
a snapshot waiting for it goes first (the `_turn` lock: CPython's locks are not fair, and a
writer that takes the lock straight back would otherwise starve the GUI for the whole batch).
While a batch is being applied the GUI's copy is renewed at most every BUSY_COPY_S. The cache
is capped from the pool the replica reports (remote_cache.block_cap), and a batch that stores
more blocks than that pool is refused as malformed (KVEventSubscriber.set_pool)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

from kvscope.app.core.block_hashes import ALGOS, DEFAULT_ALGO, BlockHasher, hasher_for
from kvscope.app.remote.connection import Connection
from kvscope.app.remote.kv_subscriber import KVEventSubscriber, SubscriberStatus
from kvscope.app.remote.kv_wire import EventBatch
from kvscope.app.remote.metrics_scrape import MetricsParseError, RemoteMetrics, parse_metrics
from kvscope.app.remote.remote_cache import RemoteCache, block_cap

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 1.0
READ_TIMEOUT_S = 2.0
BACKOFF_CAP_S = 15.0
MAX_MODELS_BYTES = 1 << 20  # a model list, not a model
SCRAPE_DEADLINE_S = 5.0  # a whole answer, however it trickles in (reads time out per chunk)
MAX_METRICS_BYTES = 8 << 20  # vLLM's /metrics is tens of KiB; more is not a metrics page
METRICS_HISTORY = 900  # scrapes kept (15 min at 1 Hz)
BUSY_COPY_S = 1.0  # while a batch is applied, the cache is copied for the GUI at most this often


@dataclass(frozen=True)
class ReplicaSnapshot:
    connection: Connection
    status: SubscriberStatus | None  # None: no KV events endpoint configured
    http_state: str  # "connecting" | "up" | "down"
    http_error: str
    metrics: RemoteMetrics | None
    metrics_history: list[tuple[float, RemoteMetrics]]
    cache: RemoteCache
    block_size: int | None
    model: str | None
    hasher: BlockHasher | None = None  # None: block hashes not reproducible (routing by tokens)
    hash_note: str = ""  # why (or how) the hashes are reproduced
    http_retry_at: float | None = None  # time.time() of the next poll while down
    models: tuple[str, ...] = field(default_factory=tuple)  # from /v1/models


class ReplicaMonitor:
    def __init__(
        self,
        connection: Connection,
        poll_s: float = 1.0,
        max_blocks: int | None = None,
        **subscriber_options,
    ) -> None:
        """`max_blocks`: the cached blocks kept; None derives it from the pool the replica
        reports in /metrics (block_cap), DEFAULT_MAX_BLOCKS until it does."""
        self.connection = connection
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._turn = threading.Lock()  # a snapshot holds it while it waits for _lock
        self._stop = threading.Event()
        self._fixed_cap = max_blocks is not None
        self._cache = RemoteCache(
            connection.label, block_cap(None) if max_blocks is None else max_blocks
        )
        self._copy: RemoteCache | None = None
        self._copy_version = -1
        self._copied_at = 0.0  # time.monotonic() of the copy
        self._applying = False  # a batch is being applied, slice by slice
        self._metrics: RemoteMetrics | None = None
        self._history: list[tuple[float, RemoteMetrics]] = []
        self._http_state = "connecting"
        self._http_error = ""
        self._http_retry_at: float | None = None
        self._models: tuple[str, ...] = ()
        self._subscriber: KVEventSubscriber | None = None
        if connection.kv_events:
            self._subscriber = KVEventSubscriber(
                connection.kv_events,
                connection.kv_replay,
                connection.topic,
                on_batch=self._on_batch,
                **subscriber_options,
            )
        self._poller = threading.Thread(target=self._poll, name="kvscope-metrics", daemon=True)

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> ReplicaMonitor:
        if self._subscriber is not None:
            self._subscriber.start()
        self._poller.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Ends both threads; waits at most `timeout` (0: signal and return at once, the
        threads finish on their own within a poll timeout)."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        if self._subscriber is not None:
            self._subscriber.stop(timeout)
        if self._poller.is_alive():
            self._poller.join(max(0.0, deadline - time.monotonic()))

    def alive(self) -> bool:
        """Whether either thread still runs (after stop(): until they have wound down)."""
        sub = self._subscriber
        return self._poller.is_alive() or (sub is not None and sub.alive())

    # ---- the subscriber's thread ---------------------------------------------------------
    def _on_batch(self, seq: int, batch: EventBatch) -> None:
        self._applying = True
        try:
            self._sliced(self._cache.applying(batch, time.time()))
        finally:
            self._applying = False

    def _sliced(self, steps: Iterator[None]) -> None:
        """Runs a cache change one step per hold of the lock; between steps, a snapshot that
        waits takes the lock first (it holds `_turn` while waiting: we queue behind it)."""
        done = object()
        while True:
            with self._lock:
                if next(steps, done) is done:
                    return
            with self._turn:
                pass

    def _set_pool(self, num_gpu_blocks: int | None) -> None:
        """The poller's thread: the cap follows the pool the replica reports, and a batch that
        stores more blocks than the pool is malformed."""
        if self._subscriber is not None:
            self._subscriber.set_pool(num_gpu_blocks)
        if self._fixed_cap:
            return
        cap = block_cap(num_gpu_blocks)
        if cap == self._cache.max_blocks:
            return
        with self._lock:
            self._cache.max_blocks = cap
        self._sliced(self._cache.trimming())

    # ---- the poller's thread -------------------------------------------------------------
    def _poll(self) -> None:
        headers = (
            {"Authorization": f"Bearer {self.connection.api_key}"}
            if self.connection.api_key
            else {}
        )
        timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        delay = self.poll_s
        with httpx.Client(base_url=self.connection.url, headers=headers, timeout=timeout) as client:
            while not self._stop.is_set():
                try:
                    ok = self._scrape(client)
                except Exception as e:  # whatever a server sends, the poller goes on
                    log.exception("scraping %s failed", self.connection.url)
                    with self._lock:
                        self._http_state, self._http_error = "down", f"{type(e).__name__}: {e}"
                    ok = False
                delay = self.poll_s if ok else min(max(delay, self.poll_s) * 2, BACKOFF_CAP_S)
                if not ok:
                    with self._lock:
                        self._http_retry_at = time.time() + delay
                self._stop.wait(delay)

    def _read(self, client: httpx.Client, path: str, cap: int) -> bytes:
        """GET `path`'s body, bounded in bytes and in total time (a server that sends a byte
        a second never times out a read), and cut short when the monitor stops."""
        deadline = time.monotonic() + SCRAPE_DEADLINE_S
        url = f"{self.connection.url}{path}"
        with client.stream("GET", path) as response:
            if response.status_code != 200:
                raise _HttpStatus(f"HTTP {response.status_code} from {url}")
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > cap:
                    raise _HttpStatus(f"{url} sent over {cap >> 20} MiB: not read further")
                if time.monotonic() > deadline:
                    raise _HttpStatus(f"{url} took over {SCRAPE_DEADLINE_S:g} s to answer")
                if self._stop.is_set():
                    raise _HttpStatus(f"{url}: stopped while reading")
        return bytes(body)

    def _scrape(self, client: httpx.Client) -> bool:
        try:
            body = self._read(client, "/metrics", MAX_METRICS_BYTES)
            metrics = parse_metrics(body.decode("utf-8", errors="replace"))
            if not self._models:
                self._models = self._fetch_models(client)
        except (httpx.HTTPError, _HttpStatus, MetricsParseError) as e:
            error = str(e) if isinstance(e, (_HttpStatus, MetricsParseError)) else _describe(e)
            with self._lock:
                self._http_state, self._http_error = "down", error
            return False
        with self._lock:
            self._http_state, self._http_error, self._http_retry_at = "up", "", None
            self._metrics = metrics
            self._history.append((metrics.scraped_at, metrics))
            if len(self._history) > METRICS_HISTORY:
                del self._history[: METRICS_HISTORY // 4]
        self._set_pool(metrics.num_gpu_blocks)
        return True

    def _fetch_models(self, client: httpx.Client) -> tuple[str, ...]:
        try:
            return model_ids(json.loads(self._read(client, "/v1/models", MAX_MODELS_BYTES)))
        except (httpx.HTTPError, _HttpStatus, ValueError, RecursionError):
            return ()

    # ---- the GUI's side ------------------------------------------------------------------
    def snapshot(self) -> ReplicaSnapshot:
        # The copy replaced is freed when this frame ends, after the lock is let go: under a
        # flood it holds the only reference to every block evicted since (tens of ms to free).
        retired = self._copy  # noqa: F841
        with self._turn, self._lock:
            now = time.monotonic()
            # Mid-batch, a copy a second: after each, the writer copies every shard it touches
            # again, and a flood touches them all (a 600,000-block batch took 3x as long at
            # 4 Hz, its shard copies setting off a full collection every ~2 s).
            busy = self._applying and now - self._copied_at < BUSY_COPY_S
            if self._copy is None or (self._copy_version != self._cache.version and not busy):
                self._copy = self._cache.copy()
                self._copy_version = self._cache.version
                self._copied_at = now
            metrics = self._metrics
            block_size = self._cache.block_size or (metrics.block_size if metrics else None)
            model = (metrics.model if metrics else None) or (
                self._models[0] if self._models else None
            )
            hasher, note = self._hasher(metrics)
            return ReplicaSnapshot(
                connection=self.connection,
                # Read fresh: on_status throttles seq-only changes.
                status=self._subscriber.status() if self._subscriber else None,
                http_state=self._http_state,
                http_error=self._http_error,
                metrics=metrics,
                metrics_history=list(self._history),
                cache=self._copy,
                block_size=block_size,
                model=model,
                hasher=hasher,
                hash_note=note,
                http_retry_at=self._http_retry_at,
                models=self._models,
            )

    def _hasher(self, metrics: RemoteMetrics | None) -> tuple[BlockHasher | None, str]:
        algo = metrics.hash_algo if metrics else None
        seed = self.connection.hash_seed
        if algo is not None and algo not in ALGOS:
            return None, f"hash algorithm {algo!r} is not reproducible; matching token ids"
        used = algo or DEFAULT_ALGO
        hasher = hasher_for(seed, used)
        if hasher is None:  # an xxhash algorithm seeded at random: only the server knows
            return None, f"{used} with a random seed (PYTHONHASHSEED unset); matching token ids"
        assumed = "" if algo else " (assumed: the server does not say)"
        seed_note = f"PYTHONHASHSEED={seed}" if seed else "PYTHONHASHSEED unset (vLLM's fixed seed)"
        return hasher, f"{used}{assumed}, {seed_note}"


MAX_MODELS = 256
MAX_MODEL_ID = 256


def model_ids(body) -> tuple[str, ...]:
    """The ids of a /v1/models answer; entries that are not {"id": str} are skipped, and the
    list and each name are bounded (a peer's word, shown on its card)."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return ()
    ids = (m.get("id") for m in data[:MAX_MODELS] if isinstance(m, dict))
    return tuple(i[:MAX_MODEL_ID] for i in ids if isinstance(i, str) and i)


class _HttpStatus(Exception):
    pass


def _describe(error: Exception) -> str:
    text = str(error) or error.__class__.__doc__ or ""
    return f"{type(error).__name__}: {text.strip()}"
