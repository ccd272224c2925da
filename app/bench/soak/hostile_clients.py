"""The hostile clients of `kvscope bench --soak`: requests built to hurt the server (issue 27),
each with the outcome a sound server gives it, so the soak can count what was refused as
expected and name what was not.

- clients that go away: a stream dropped after a few chunks, a whole request whose client times
  out while it generates (both must be aborted, their blocks freed);
- bodies too big or absurd: over 4 MiB (413), a prompt of 3.9 M characters (400 before any
  tokenizing), max_tokens of 10^9, 250 stop strings, n of 10^6, a 1 MB model name (404), booleans
  as token ids, JSON that does not parse, fields of the wrong type (400s);
- sockets that never finish a request: half-open (connected, nothing sent) and slowloris (a
  header byte a second), held in a bounded pool (SlowSockets) and replaced as they close.

All on 127.0.0.1, each bounded in bytes and seconds."""

from __future__ import annotations

import functools
import http.client
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

HOSTILE_TIMEOUT_S = 60.0
GAVE_UP_AFTER_S = 1.0  # the impatient client of a whole request
BIG_BODY = (4 << 20) + (512 << 10)  # over the server's 4 MiB
BIG_PROMPT_CHARS = 3_900_000  # under the body limit, far over what max_model_len can hold


@dataclass(frozen=True)
class HostileResult:
    action: str
    expected: bool  # the server answered as a sound server does
    detail: str  # what came back
    server_error: bool = False  # a 5xx


def _post(host, port, path: str, body: bytes, timeout: float = HOSTILE_TIMEOUT_S):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        try:
            conn.request("POST", path, body, {"Content-Type": "application/json"})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before the whole body is sent
        resp = conn.getresponse()
        return resp.status, resp.read()[:300]
    finally:
        conn.close()


def _expect(action: str, statuses: tuple[int, ...], send: Callable[[], tuple[int, bytes]]):
    try:
        status, head = send()
    except (OSError, http.client.HTTPException) as e:
        return HostileResult(action, False, f"{type(e).__name__}: {e}")
    detail = f"HTTP {status}: {head[:120]!r}"
    return HostileResult(action, status in statuses, detail, server_error=status >= 500)


def _json(body: dict) -> bytes:
    return json.dumps(body).encode()


def refused_requests(model: str) -> list[tuple[str, str, bytes, tuple[int, ...]]]:
    """(name, path, body, the statuses a sound server answers) for each absurd request."""
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return [
        ("huge max_tokens", "/v1/chat/completions", _json(chat | {"max_tokens": 10**9}), (400,)),
        ("250 stop strings", "/v1/completions",
         _json({"model": model, "prompt": "hi", "stop": [f"s{i}" for i in range(250)]}), (400,)),
        ("n of 10^6", "/v1/chat/completions", _json(chat | {"n": 10**6}), (400,)),
        ("bad JSON", "/v1/chat/completions", b'{"model": "x", "messages": [', (400,)),
        ("bad types", "/v1/chat/completions",
         _json({"model": model, "messages": 5, "max_tokens": "many"}), (400,)),
        ("booleans as token ids", "/v1/completions",
         _json({"model": model, "prompt": [True, False, True]}), (400,)),
        ("1 MB model name", "/v1/completions", _json({"model": "m" * 1_000_000, "prompt": "hi"}),
         (404,)),
        ("3.9 M-character prompt", "/v1/completions",
         _json({"model": model, "prompt": "word " * (BIG_PROMPT_CHARS // 5), "max_tokens": 4}),
         (400,)),
        # Tokenized off the event loop or refused: either way the others must stay served.
        ("3.9 M characters to /tokenize", "/tokenize",
         _json({"prompt": "word " * (BIG_PROMPT_CHARS // 5)}), (200, 400)),
        ("body over 4 MiB", "/v1/completions",
         _json({"model": model, "prompt": "x" * BIG_BODY}), (413,)),
    ]  # fmt: skip


def dropped_stream(host: str, port: int, model: str) -> HostileResult:
    """A stream closed after three chunks of a long reply."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    conn = http.client.HTTPConnection(host, port, timeout=HOSTILE_TIMEOUT_S)
    try:
        conn.request(
            "POST", "/v1/chat/completions", _json(body), {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        if resp.status != 200:
            detail = f"HTTP {resp.status}: {resp.read()[:120]!r}"
            return HostileResult("dropped stream", False, detail, resp.status >= 500)
        chunks = 0
        for line in resp:
            chunks += line.startswith(b"data: ")
            if chunks >= 3:
                break
        return HostileResult("dropped stream", chunks >= 3, f"dropped after {chunks} chunks")
    except (OSError, http.client.HTTPException) as e:
        return HostileResult("dropped stream", False, f"{type(e).__name__}: {e}")
    finally:
        conn.close()  # mid-stream: the server must abort the request


def impatient_whole_request(host: str, port: int, model: str) -> HostileResult:
    """A whole request for 1,000 tokens whose client gives up after a second."""
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True}
    try:
        status, head = _post(host, port, "/v1/completions", _json(body), GAVE_UP_AFTER_S)
    except TimeoutError:
        return HostileResult("impatient whole request", True, "timed out, as its client meant")
    except (OSError, http.client.HTTPException) as e:
        return HostileResult("impatient whole request", False, f"{type(e).__name__}: {e}")
    return HostileResult(
        "impatient whole request", False, f"answered in time: HTTP {status}", status >= 500
    )


def hostile_actions(host: str, port: int, model: str) -> list[Callable[[], HostileResult]]:
    """One round of hostile requests, each a call returning its result."""
    actions: list[Callable[[], HostileResult]] = [
        lambda: dropped_stream(host, port, model),
        lambda: impatient_whole_request(host, port, model),
    ]
    for name, path, body, statuses in refused_requests(model):
        send = functools.partial(_post, host, port, path, body)
        actions.append(functools.partial(_expect, name, statuses, send))
    return actions


class SlowSockets:
    """Up to `half_open` connected sockets that send nothing and `slowloris` that send a header
    byte a second, replaced as the server closes them; counts how many it closed (a server that
    times out incomplete requests closes them all, sooner or later)."""

    def __init__(self, host: str, port: int, half_open: int = 64, slowloris: int = 16) -> None:
        self.host, self.port = host, port
        self.want = {"half-open": half_open, "slowloris": slowloris}
        self._held: list[tuple[str, socket.socket, float]] = []
        self.opened = {"half-open": 0, "slowloris": 0}
        self.closed_by_server = {"half-open": 0, "slowloris": 0}
        self.refused = 0  # connects that failed (a full server: expected, counted)
        self.lifetimes: list[float] = []  # seconds the server kept a closed one open
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-slow-sockets", daemon=True)

    def start(self) -> SlowSockets:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for _, s, _ in self._held:
            s.close()
        self._held.clear()

    def held(self) -> int:
        return len(self._held)

    def _open(self, kind: str) -> None:
        try:
            s = socket.create_connection((self.host, self.port), timeout=2)
        except OSError:
            self.refused += 1
            return
        s.setblocking(False)
        if kind == "slowloris":
            try:
                s.send(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            except OSError:
                pass
        self._held.append((kind, s, time.monotonic()))
        self.opened[kind] += 1

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            kept = []
            for kind, s, since in self._held:
                if self._server_closed(kind, s):
                    self.closed_by_server[kind] += 1
                    self.lifetimes.append(time.monotonic() - since)
                    s.close()
                else:
                    kept.append((kind, s, since))
            self._held = kept
            for kind, want in self.want.items():
                have = sum(k == kind for k, _, _ in self._held)
                for _ in range(min(8, want - have)):  # ramp up a few a second
                    self._open(kind)

    @staticmethod
    def _server_closed(kind: str, s: socket.socket) -> bool:
        try:
            s.recv(4096)  # a 408/503 answer, or b"" when the server closed it
            return True
        except BlockingIOError:
            pass
        except OSError:
            return True
        if kind == "slowloris":
            try:
                s.send(b"X")  # the next header byte
            except BlockingIOError:
                pass
            except OSError:
                return True
        return False
