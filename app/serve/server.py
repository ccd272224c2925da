"""Assemble and run the server: FastAPI app + uvicorn, the engine thread, metrics, KV events.

`Server(llm, ...)` serves an engine that already exists (a test's, or the app's); `run(args)`
is `kvscope serve`. `start()` runs uvicorn in a thread of its own and returns once it listens,
so tests and benchmarks drive a real socket. Both run uvicorn with the same connection limits
(app/serve/connections.py): request deadlines and a cap sized from RLIMIT_NOFILE."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from kvscope.app.core.block_hashes import DEFAULT_ALGO
from kvscope.app.serve.connections import ConnectionLimits, guarded_protocol
from kvscope.app.serve.engine_loop import EngineDriver, EngineThread
from kvscope.app.serve.errors import install_error_handlers
from kvscope.app.serve.fd_budget import ConnectionBudget, budget_for_this_process
from kvscope.app.serve.guards import ApiKeyGuard, BodySizeGuard
from kvscope.app.serve.kv_events import KVEventTranslator, ZmqEventPublisher, vllm_hasher
from kvscope.app.serve.log_limits import install_log_limits
from kvscope.app.serve.metrics import ServerMetrics
from kvscope.app.serve.responses import TokenText
from kvscope.app.serve.routes import build_router
from kvscope.app.serve.state import ServerState
from kvscope.engine import LLM, LLMEngine

log = logging.getLogger(__name__)

API_KEY_ENV = "KVSCOPE_API_KEY"
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 15


def served_model_name(engine: LLMEngine) -> str:
    """The model's file or folder name without suffixes, e.g. "SmolLM2-135M-Instruct"."""
    name = Path(str(engine.model_source)).name
    for suffix in (".gguf", ".Q4_0", ".Q4_1", ".Q4_K_M", ".Q5_K_M", ".Q6_K", ".Q8_0", ".F16"):
        name = name.removesuffix(suffix)
    return name or "kvscope"


class Server:
    def __init__(
        self,
        llm: LLM,
        host: str = "127.0.0.1",
        port: int = 8000,
        api_key: str | None = None,
        model_name: str | None = None,
        kv_events: str | None = None,
        kv_events_replay: str | None = None,
        kv_events_topic: str = "",
        kv_events_encoding: str = "map",
        prefix_caching_hash_algo: str = DEFAULT_ALGO,
        driver: EngineDriver | None = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        """`driver`: who steps the engine (the app's worker); None: a thread of our own.
        `limits`: connection deadlines and cap; None: the defaults, the cap from RLIMIT_NOFILE."""
        engine = llm.engine
        self.host, self.port = host, port
        self.limits = limits or ConnectionLimits()
        self.connection_budget: ConnectionBudget | None = None  # sized when uvicorn starts
        self.model_name = model_name or served_model_name(engine)
        self.metrics = ServerMetrics(
            self.model_name, engine.max_model_len, prefix_caching_hash_algo
        )
        self.metrics.describe_cache(engine)
        # Our own engine thread, unless the caller steps the engine (and drains the driver).
        self._engine_thread: EngineThread | None = None
        if driver is None:
            self._engine_thread = EngineThread(EngineDriver(engine))
            driver = self._engine_thread.driver
        self.driver = driver
        self.driver.step_hooks.append(lambda outs: self.metrics.observe(engine, outs))
        self.publisher: ZmqEventPublisher | None = None
        self.translator: KVEventTranslator | None = None
        if kv_events:
            self.publisher = ZmqEventPublisher(kv_events, kv_events_replay, kv_events_topic)
            self.translator = KVEventTranslator(
                engine, kv_events_encoding, vllm_hasher(prefix_caching_hash_algo)
            )
            self.driver.step_hooks.append(self._publish_kv_events)
            self._publish_kv_events([])  # the pool as it stands, before any traffic
        self.state = ServerState(
            engine=engine,
            driver=self.driver,
            metrics=self.metrics,
            model_names=(self.model_name,),
            max_model_len=engine.max_model_len,
            token_text=TokenText(engine.tokenizer),
            # engine.max_prompt_chars is max_model_len x the longest token's characters.
            longest_token_chars=engine.max_prompt_chars // engine.max_model_len,
        )
        self.app = build_app(self.state, api_key)
        self._uvicorn: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def _publish_kv_events(self, _outputs) -> None:
        if self.translator is None or self.publisher is None:  # stopped
            return
        batch = self.translator.take()
        if batch is not None:
            self.publisher.publish(batch)

    def _config(self) -> uvicorn.Config:
        """uvicorn's settings, the same for serve_forever() and start(): the limits included."""
        config, self.connection_budget = uvicorn_config(self.app, self.host, self.port, self.limits)
        return config

    def start_engine_thread(self) -> None:
        """Step the engine on our own thread (none when the caller steps it)."""
        if self._engine_thread is not None:
            self._engine_thread.start()

    def start(self) -> Server:
        """Serve from a background thread; returns once the socket listens."""
        self.start_engine_thread()
        self._uvicorn = uvicorn.Server(self._config())
        self._thread = threading.Thread(
            target=self._uvicorn.run, name="kvscope-serve-http", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start on {self.host}:{self.port}")
            time.sleep(0.02)
        if self.port == 0:  # an ephemeral port: read back which one
            self.port = self._uvicorn.servers[0].sockets[0].getsockname()[1]
        return self

    def serve_forever(self) -> None:
        self.start_engine_thread()
        try:
            uvicorn.Server(self._config()).run()
        finally:
            self._stop_engine_side()

    def stop(self) -> None:
        """In-flight requests fail first (their handlers return), then the HTTP side stops."""
        self._stop_engine_side()
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=STOP_TIMEOUT_S)

    def _stop_engine_side(self) -> None:
        if self._engine_thread is not None:
            self._engine_thread.stop()
        else:  # the caller steps the engine and calls this from that thread
            self.driver.fail_all(RuntimeError("the server was stopped"))
        if self.translator is not None:
            self.translator.close()
            self.translator = None
        if self.publisher is not None:
            self.publisher.shutdown()
            self.publisher = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def uvicorn_config(
    app: object, host: str, port: int, limits: ConnectionLimits
) -> tuple[uvicorn.Config, ConnectionBudget]:
    """uvicorn's settings for `app`, with our connection limits and the fd budget they use."""
    budget = budget_for_this_process()
    if limits.max_connections is not None:
        budget = replace(budget, cap=limits.max_connections)
    log.info("connection limits: %s", budget.describe())
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]  # any ASGI callable
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",  # nothing of ours runs at startup or shutdown
        timeout_graceful_shutdown=5,
        http=guarded_protocol(limits, budget),
        timeout_keep_alive=limits.keep_alive_s,  # type: ignore[arg-type]
        backlog=budget.backlog,
    )
    install_log_limits()  # after the Config: it configures uvicorn's loggers
    return config, budget


def build_app(state: ServerState, api_key: str | None) -> FastAPI:
    app = FastAPI(title="KVScope", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    app.include_router(build_router(state))
    # Outermost first: size, then the key; both answer OpenAI error bodies themselves.
    app.add_middleware(ApiKeyGuard, api_key=api_key)
    app.add_middleware(BodySizeGuard)
    return app
