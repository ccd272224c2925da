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
    kv_events: bool | tuple[str, str] = False,
    **server_options,
):
    """A started Server (`.stop()` it); with `kv_events`, publishing on fresh endpoints (or the
    (pub, replay) pair given), which it keeps as `.kv_endpoints`."""
    from kvscope.app.serve.server import Server
    from kvscope.engine import LLM

    llm = LLM(
        model=model,
        device="cpu",
        dtype="float32",
        num_kv_blocks=num_kv_blocks,
        block_size=block_size,
        max_model_len=max_model_len,
    )
    if kv_events:
        pub, replay = (
            kv_events if isinstance(kv_events, tuple) else (free_endpoint(), free_endpoint())
        )
        server_options.update(kv_events=pub, kv_events_replay=replay)
    server = Server(llm, port=0, **server_options).start()
    server.kv_endpoints = (pub, replay) if kv_events else None
    return server


def engine_event_hashes(srv, hasher=None) -> set:
    """The block hashes `srv`'s KV events should announce for what its engine caches now: each
    cached block's token chain (its parents' tokens, then its own) hashed as vLLM hashes it,
    by `hasher` (default: the server's own vLLM hasher, PYTHONHASHSEED as this process has it)."""
    hasher = hasher or srv.translator.hasher

    def read(engine):
        total = engine.stats()["kv_blocks_total"]
        return [k for k in map(engine.block_hash, range(total)) if k is not None]

    keys = srv.driver.call(read).result(timeout=30)
    links = {own: (parent, tokens) for own, parent, tokens, _group in keys}
    digests: dict = {}

    def digest(own):
        if own not in digests:
            parent, tokens = links[own]
            digests[own] = hasher.hash_block(None if parent is None else digest(parent), tokens)
        return digests[own]

    from kvscope.app.core.block_hashes import external_hash

    return {external_hash(digest(own), hasher.int_hashes) for own in links}
