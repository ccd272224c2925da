"""/health answers from the event loop while every pool is busy (issue 43: 1,000 concurrent
/tokenize calls pushed it to 4 s): it waits on neither the tokenizing pool nor the engine, and a
/tokenize answer is built whole in the tokenizing pool, so a flood of them does not fill the
event loop with JSON encoding."""

from __future__ import annotations

import asyncio
import threading

import fastapi.routing
import httpx
import pytest
from served import start_server

from kvscope.app.serve.prompt_work import TOKENIZE_WORKERS

QUEUED = 200


@pytest.fixture(scope="module")
def server(default_model):
    srv = start_server(default_model, 32, 512)
    yield srv
    srv.stop()


def _health(server) -> int:
    return httpx.get(f"{server.base_url}/health", timeout=10).status_code


def test_health_answers_while_the_tokenizing_pool_and_the_engine_are_held(server):
    engine = server.state.engine
    original = engine.tokenize
    release, in_pool = threading.Event(), threading.Semaphore(0)

    def held(prompt):
        in_pool.release()
        release.wait(60)
        return original(prompt)

    engine.tokenize = held
    engine_held = server.driver.call(lambda _: release.wait(60))  # the engine thread waits too

    async def flood() -> list[int]:
        limits = httpx.Limits(max_connections=QUEUED)
        async with httpx.AsyncClient(limits=limits, timeout=60) as client:
            body = {"prompt": "word " * 50}
            tasks = [client.post(f"{server.base_url}/tokenize", json=body) for _ in range(QUEUED)]
            return [r.status_code for r in await asyncio.gather(*tasks)]

    codes: list[int] = []
    flooding = threading.Thread(target=lambda: codes.extend(asyncio.run(flood())))
    flooding.start()
    try:
        for _ in range(TOKENIZE_WORKERS):  # every worker is inside a tokenize call, held
            assert in_pool.acquire(timeout=30)
        for _ in range(5):
            assert _health(server) == 200
        assert not engine_held.done() and not release.is_set()  # answered while both held
    finally:
        release.set()
        flooding.join(timeout=60)
        engine.tokenize = original
    assert codes == [200] * QUEUED


def test_a_tokenize_answer_is_built_in_the_tokenizing_pool(server, monkeypatch):
    """Its token strings and its JSON: neither on the event loop (FastAPI's jsonable_encoder
    takes ms per answer there, and 1,000 of them held /health for seconds)."""
    tokenizer = server.state.engine.tokenizer
    converted: list[str] = []
    original = tokenizer.convert_ids_to_tokens

    def spy(ids, *args, **kwargs):
        converted.append(threading.current_thread().name)
        return original(ids, *args, **kwargs)

    encoded: list[object] = []
    encoder = fastapi.routing.jsonable_encoder
    monkeypatch.setattr(
        fastapi.routing,
        "jsonable_encoder",
        lambda value, *a, **k: encoded.append(value) or encoder(value, *a, **k),
    )
    monkeypatch.setattr(tokenizer, "convert_ids_to_tokens", spy)
    body = {"prompt": "The quick brown fox", "return_token_strs": True}
    reply = httpx.post(f"{server.base_url}/tokenize", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["count"] == len(answer["tokens"]) == len(answer["token_strs"]) > 0
    assert answer["max_model_len"] == 512
    assert converted and all(name.startswith("kvscope-tokenize") for name in converted)
    assert not any(isinstance(v, dict) and "tokens" in v for v in encoded), encoded
