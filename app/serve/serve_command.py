"""`kvscope serve`: the port taken at once, the engine built behind it, each stage said.

The listening socket comes first, served by StartingApp (app/serve/startup.py) while a loader
thread reads the model and builds the engine; then every request goes to the real server. The
terminal prints each stage with its time, and a failure ends the process with exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import uvicorn

from kvscope.app.serve.connections import ConnectionLimits
from kvscope.app.serve.fd_budget import ConnectionBudget
from kvscope.app.serve.server import API_KEY_ENV, Server, uvicorn_config
from kvscope.app.serve.startup import StartingApp


def run(args: argparse.Namespace) -> int:
    """`kvscope serve`: listen at once (StartingApp answers while the engine is built on a
    thread of its own), then serve the engine; the terminal says each stage."""
    from kvscope.app.core.engine_flags import check_engine_flags

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    if args.kv_events_replay and not args.kv_events:
        print("error: --kv-events-replay needs --kv-events", file=sys.stderr)
        return 2
    try:
        check_engine_flags(args)  # a bad flag is said before the port is taken
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        print(f"warning: serving on {args.host} without an API key", file=sys.stderr)
    starting = StartingApp()
    limits = ConnectionLimits()
    config, budget = uvicorn_config(starting, args.host, args.port, limits)
    http = uvicorn.Server(config)
    started: list[Server] = []
    exit_code: list[int] = []
    loader = threading.Thread(
        target=_build_and_hand_over,
        args=(args, api_key, limits, budget, starting, http, started, exit_code),
        name="kvscope-serve-load",
        daemon=True,
    )
    print(
        f"KVScope starting on http://{args.host}:{args.port}: /health answers 503 'starting'"
        " until the model is ready",
        file=sys.stderr,
    )
    loader.start()
    try:
        http.run()
    except KeyboardInterrupt:  # uvicorn shuts down gracefully, then re-raises the Ctrl-C
        pass
    finally:
        for server in started:
            server.stop()  # the engine side: uvicorn has stopped already
    return exit_code[0] if exit_code else 0


def _build_and_hand_over(
    args: argparse.Namespace,
    api_key: str | None,
    limits: ConnectionLimits,
    budget: ConnectionBudget,
    starting: StartingApp,
    http: uvicorn.Server,
    started: list[Server],
    exit_code: list[int],
) -> None:
    """On the loader thread: the engine, the server around it, then every request to it. A
    failure is said on the terminal and /health, and stops the process with exit code 2."""
    from kvscope.app.core.engine_flags import llm_from_args

    began = time.monotonic()

    def stage(words: str) -> None:
        starting.set_stage(words)
        print(f"  {words} ({time.monotonic() - began:.1f} s)", file=sys.stderr)

    try:
        llm = llm_from_args(args, progress=stage)
        stage("starting the engine thread")
        server = Server(
            llm,
            host=args.host,
            port=args.port,
            api_key=api_key,
            model_name=args.served_model_name,
            kv_events=args.kv_events,
            kv_events_replay=args.kv_events_replay,
            kv_events_topic=args.kv_events_topic,
            kv_events_encoding=args.kv_events_encoding,
            prefix_caching_hash_algo=args.prefix_caching_hash_algo,
            limits=limits,
        )
        server.connection_budget = budget
        started.append(server)
        server.start_engine_thread()
    except Exception as e:  # noqa: BLE001 - any failure to start is said, then the process ends
        message = str(e) if isinstance(e, (ValueError, FileNotFoundError)) else repr(e)
        starting.fail(message)
        print(f"error: {message}", file=sys.stderr)
        exit_code.append(2)
        http.should_exit = True
        return
    starting.ready(server.app)
    print(
        f"KVScope serving {server.model_name} on {server.base_url}/v1"
        f" (ready in {time.monotonic() - began:.1f} s)",
        file=sys.stderr,
    )
