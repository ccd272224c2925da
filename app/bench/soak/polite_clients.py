"""The well-behaved clients of `kvscope bench --soak`: what an editor or agent sends, whose every
request must come back whole while hostile clients do their worst.

Four kinds in turn (streamed and whole, chat and text completion), each sharing the agent system
prompt as agents do. A request is ok when it completes correctly: HTTP 200, a finish_reason, and
for a stream the [DONE] marker; anything else (an error status, a broken stream, a timeout) is
lost, and its reason is kept."""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass

from kvscope.app.bench.serving.bench import agent_messages

POLITE_TIMEOUT_S = 120.0  # a well-behaved request slower than this is lost, not waited for
KINDS = ("chat-stream", "chat-whole", "completion-stream", "completion-whole")


@dataclass(frozen=True)
class PoliteResult:
    kind: str
    ok: bool
    latency_s: float
    finished_at: float  # time.monotonic()
    error: str = ""


def _body(kind: str, model: str, k: int, max_tokens: int, system_chars: int) -> dict:
    messages = agent_messages(k, system_chars)
    body: dict = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": kind.endswith("stream"),
        "user": f"polite-{k % 4}",
    }
    if kind.startswith("chat"):
        body["messages"] = messages
    else:
        body["prompt"] = f"{messages[0]['content']}\n\nQuestion: {messages[1]['content']}\nAnswer:"
    return body


def _read_stream(resp: http.client.HTTPResponse) -> str:
    """ "" when the stream ended as it should (a finish_reason, then [DONE]); else why not."""
    finished = False
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            return "" if finished else "[DONE] without a finish_reason"
        chunk = json.loads(data)
        if "error" in chunk:
            return f"error in the stream: {str(chunk['error'])[:200]}"
        finished = finished or any(c.get("finish_reason") for c in chunk.get("choices", []))
    return "the stream ended without [DONE]"


def _check_whole(raw: bytes) -> str:
    body = json.loads(raw)
    choices = body.get("choices") or []
    if not choices or not all(c.get("finish_reason") for c in choices):
        return f"no finish_reason in {raw[:200]!r}"
    return ""


def polite_request(
    host: str, port: int, model: str, k: int, max_tokens: int = 16, system_chars: int = 1500
) -> PoliteResult:
    """Request k of the well-behaved mix (kind k % 4); what came of it."""
    kind = KINDS[k % len(KINDS)]
    path = "/v1/chat/completions" if kind.startswith("chat") else "/v1/completions"
    payload = json.dumps(_body(kind, model, k, max_tokens, system_chars))
    started = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=POLITE_TIMEOUT_S)
    try:
        conn.request("POST", path, payload, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            error = f"HTTP {resp.status}: {resp.read()[:200]!r}"
        elif kind.endswith("stream"):
            error = _read_stream(resp)
        else:
            error = _check_whole(resp.read())
    except (OSError, http.client.HTTPException, ValueError) as e:
        error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    now = time.monotonic()
    return PoliteResult(kind, not error, now - started, now, error)
