"""One streaming chat request of the serve benches, as any OpenAI-compatible server answers it.

The same client drives `kvscope serve`, llama.cpp's `llama-server` and any server given by URL,
so nothing here may depend on one server's extras: `usage` (with `stream_options.include_usage`)
and its `prompt_tokens_details.cached_tokens` are read where they are sent and left as None where
not. Output tokens are counted from the usage's `completion_tokens` when there is one (a server
may put several tokens in one chunk: llama-server holds back a partial UTF-8 character or a
possible stop string), from the content chunks otherwise; each result says which it used.
`ignore_eos` (vLLM's extra, which llama-server accepts too) makes every server produce
`max_tokens`, so all of them are timed on replies of the same length."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass, field

from kvscope.app.core.paths import ASSETS_DIR

REQUEST_TIMEOUT_S = 300.0
CUT = "cut at the time bound"
FROM_USAGE, FROM_CHUNKS = "usage", "stream chunks"


@dataclass
class RequestResult:
    ok: bool
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    tokens_from: str | None = None  # FROM_USAGE or FROM_CHUNKS
    chunks: int = 0  # content chunks seen (a chunk may carry more than one token)
    cached_tokens: int | None = None  # None: the server did not say
    prompt_tokens: int | None = None
    error: str | None = None


def agent_messages(k: int, system_chars: int | None = None) -> list[dict]:
    agent = json.loads((ASSETS_DIR / "chat_mixed.json").read_text())["agent"]
    questions = agent["questions"]
    question = f"{questions[k % len(questions)]} (request {k})"
    return [
        {"role": "system", "content": agent["system_prompt"][:system_chars]},
        {"role": "user", "content": question},
    ]


class OpenConnections:
    """The clients' live connections, so the time bound can cut the ones still streaming."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: set[http.client.HTTPConnection] = set()
        self.closed = False

    def add(self, conn: http.client.HTTPConnection) -> bool:
        with self._lock:
            if not self.closed:
                self._conns.add(conn)
            return not self.closed

    def discard(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._conns.discard(conn)

    def cut_all(self) -> None:
        with self._lock:
            self.closed = True
            for conn in self._conns:
                if conn.sock is not None:
                    try:
                        conn.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass


def request_body(model: str, k: int, max_tokens: int, system_chars: int | None) -> dict:
    return {
        "model": model,
        "messages": agent_messages(k, system_chars),
        "max_tokens": max_tokens,
        "ignore_eos": True,  # every server writes max_tokens: replies of one length
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": f"bench-{k % 8}",
    }


def _read_usage(result: RequestResult, usage: dict) -> bool:
    """The usage's figures into `result`; whether it counted the completion tokens."""
    if isinstance(usage.get("prompt_tokens"), int):
        result.prompt_tokens = usage["prompt_tokens"]
    details = usage.get("prompt_tokens_details") or {}
    if isinstance(details.get("cached_tokens"), int):
        result.cached_tokens = details["cached_tokens"]
    if isinstance(usage.get("completion_tokens"), int):
        result.tokens = usage["completion_tokens"]
        return True
    return False


def stream_one(
    host: str,
    port: int,
    model: str,
    k: int,
    settings,
    api_key: str | None,
    conns: OpenConnections | None = None,
) -> RequestResult:
    """One streaming chat request; what the client saw of it. `settings` has max_tokens and
    system_chars (a ServeBenchSettings)."""
    body = json.dumps(request_body(model, k, settings.max_tokens, settings.system_chars))
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    conn = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT_S)
    result = RequestResult(ok=False)
    try:
        sent = time.perf_counter()
        conn.connect()
        if conns is not None and not conns.add(conn):
            result.error = CUT
            return result
        conn.request("POST", "/v1/chat/completions", body, headers)
        resp = conn.getresponse()
        if resp.status != 200:
            result.error = f"HTTP {resp.status}: {resp.read()[:200]!r}"
            return result
        last = None
        finished = done = counted = False
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators, SSE comments (llama-server's pings)
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if isinstance(chunk.get("usage"), dict):
                counted = _read_usage(result, chunk["usage"]) or counted
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                # A reasoning model's first tokens arrive as reasoning_content: output too.
                if delta.get("content") or delta.get("reasoning_content"):
                    now = time.perf_counter()
                    if last is None:
                        result.ttft = now - sent
                    else:
                        result.gaps.append(now - last)
                    last = now
                    result.chunks += 1
                if choice.get("finish_reason"):
                    finished = True
        if not counted:
            result.tokens = result.chunks
        result.tokens_from = FROM_USAGE if counted else FROM_CHUNKS
        result.ok = done and finished
        if not result.ok:
            cut = conns is not None and conns.closed
            result.error = CUT if cut else "stream ended without a finish_reason and [DONE]"
    except (OSError, http.client.HTTPException, ValueError) as e:
        result.error = CUT if conns is not None and conns.closed else f"{type(e).__name__}: {e}"
    finally:
        if conns is not None:
            conns.discard(conn)
        conn.close()
    return result
