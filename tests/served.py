"""A real `kvscope serve` Server over the bundled model in this process, for the tests that
talk to one over HTTP and ZMQ: float32 on the CPU, a small pool, port 0 (the OS picks)."""

from __future__ import annotations

import socket


def free_endpoint() -> str:
    """A tcp:// endpoint on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def start_server(
    model,
    num_kv_blocks: int,
    max_model_len: int = 256,
    block_size: int = 16,
    kv_events: bool = False,
    **server_options,
):
    """A started Server (`.stop()` it); with `kv_events`, publishing on fresh endpoints, which
    it keeps as `.kv_endpoints` (pub, replay)."""
    from app.serve.server import Server
    from engine import LLM

    llm = LLM(
        model=model,
        device="cpu",
        dtype="float32",
        num_kv_blocks=num_kv_blocks,
        block_size=block_size,
        max_model_len=max_model_len,
    )
    if kv_events:
        pub, replay = free_endpoint(), free_endpoint()
        server_options.update(kv_events=pub, kv_events_replay=replay)
    server = Server(llm, port=0, **server_options).start()
    server.kv_endpoints = (pub, replay) if kv_events else None
    return server
