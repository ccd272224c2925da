"""Connections built to hurt `kvscope serve` (issue 27 item 2): half-open sockets, trickled
requests, more connections than the cap, a process out of file descriptors. Real sockets on
127.0.0.1 against a real Server over a tiny model; deadlines shortened so each test takes
seconds. The server keeps serving after each."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from repo_paths import REPO
from served import start_server
from tiny_models import make_tiny_gguf

from kvscope.app.serve.connections import PER_CLIENT_503S, ConnectionLimits, per_client_cap
from kvscope.app.serve.fd_budget import connection_budget
from kvscope.app.serve.log_limits import RateLimitFilter

HANG_S = 15  # a closed socket shows within this; past it the server is holding it
SHORT = ConnectionLimits(header_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=1.0)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path, _weights = make_tiny_gguf("llama", tmp_path_factory.mktemp("conn") / "tiny.gguf")
    return path


@pytest.fixture(scope="module")
def server(tiny_gguf):
    srv = start_server(str(tiny_gguf), 16, 64, limits=SHORT)
    yield srv
    srv.stop()


def _connect(srv, sent: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=HANG_S)
    if sent:
        sock.sendall(sent)
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """Read until the server closes (True) or HANG_S passes with the socket still open."""
    deadline = time.monotonic() + HANG_S
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    finally:
        sock.close()
    return False


def _keep_alive_health(sock: socket.socket) -> bytes:
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    return answer


def test_incomplete_requests_are_closed_after_their_deadline(server):
    silent = _connect(server)  # connects and never sends: half-open
    partial_line = _connect(server, b"GET /health HT")
    partial_body = _connect(
        server,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 200\r\n\r\n" + b'{"model": "x", "pro',
    )
    # After one whole request, the next one's first bytes: uvicorn cancels its keep-alive
    # timer on any byte and, before these deadlines, nothing else timed the socket out.
    restarted = _connect(server)
    _keep_alive_health(restarted)
    restarted.sendall(b"GET /heal")
    for name, sock in [
        ("silent", silent),
        ("partial request line", partial_line),
        ("partial body", partial_body),
        ("partial second request", restarted),
    ]:
        assert _closed_by_server(sock), f"the {name} connection was held past {HANG_S} s"
    assert httpx.get(f"{server.base_url}/health", timeout=HANG_S).status_code == 200


def test_an_idle_keep_alive_connection_is_closed(server):
    sock = _connect(server)
    _keep_alive_health(sock)
    assert _closed_by_server(sock)


def test_a_request_being_answered_has_no_deadline(server):
    """The deadlines are for a request to arrive: a whole (non-streamed) reply that takes
    longer than all of them, the socket silent meanwhile, is not cut."""

    def slow_step(_outputs) -> None:
        time.sleep(0.05)  # 40 steps: 2 s in all

    server.driver.step_hooks.append(slow_step)
    body = {"model": server.model_name, "prompt": "hi", "max_tokens": 40, "ignore_eos": True}
    try:
        started = time.monotonic()
        reply = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
        took = time.monotonic() - started
    finally:
        server.driver.step_hooks.remove(slow_step)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 40
    assert took > SHORT.header_timeout_s + SHORT.body_timeout_s  # it did outlast them


@pytest.fixture(scope="module")
def capped_server(tiny_gguf):
    limits = ConnectionLimits(max_connections=8, header_timeout_s=HANG_S, keep_alive_s=HANG_S)
    srv = start_server(str(tiny_gguf), 16, 64, limits=limits)
    yield srv
    srv.stop()


def test_past_the_connection_cap_a_request_gets_503_until_the_others_go(capped_server):
    url = f"{capped_server.base_url}/health"
    held = [_connect(capped_server) for _ in range(8)]
    for sock in held[:4]:  # kept-alive ones count as silent ones do
        _keep_alive_health(sock)
    refused = httpx.get(url, timeout=HANG_S)
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert error["type"] == "service_unavailable"
    assert "limit of 8 open connections" in error["message"], error
    for sock in held:
        sock.close()
    deadline = time.monotonic() + HANG_S
    while (status := httpx.get(url, timeout=HANG_S).status_code) != 200:
        assert time.monotonic() < deadline, f"still {status} after the held connections closed"
        time.sleep(0.05)


def _get_from(srv, address: str) -> tuple[int | None, bytes]:
    """GET /health on a connection from `address` (any 127.x.x.x reaches 127.0.0.1 on Linux):
    (status, body), or (None, b"") when the server closed it unanswered."""
    sock = socket.create_connection(
        ("127.0.0.1", srv.port), timeout=HANG_S, source_address=(address, 0)
    )
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, BrokenPipeError):
        return None, b""
    finally:
        sock.close()
    if not data:
        return None, b""
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _answer(sock: socket.socket) -> int | None:
    """GET /health on an open connection, then close it: the status, or None when the server
    closed it unanswered."""
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        data = sock.recv(65536)
    except (ConnectionResetError, BrokenPipeError):
        return None
    finally:
        sock.close()
    return int(data.split()[1]) if data else None


def test_one_address_cannot_hold_every_slot(tiny_gguf):
    """One client re-opening sockets as they are closed held every one of the 4,096 slots:
    now an address holding its share gets 503s naming it, then its connections are closed at
    once, and another address still gets in."""
    limits = ConnectionLimits(
        max_connections=16, max_connections_per_client=4, header_timeout_s=HANG_S
    )
    srv = start_server(str(tiny_gguf), 16, 64, limits=limits)
    try:
        held = [_connect(srv) for _ in range(4)]
        status, body = _get_from(srv, "127.0.0.1")
        assert status == 503, body
        message = json.loads(body)["error"]["message"]
        assert "your address holds 4 open connections, its limit of 4" in message, message
        assert "of the server's 16" in message, message
        # It opens all it can and keeps them, silent: its 4 served ones would hold their
        # slots HANG_S (the head deadline), all 16 of them before.
        held += [_connect(srv) for _ in range(PER_CLIENT_503S + 12)]
        deadline = time.monotonic() + HANG_S / 3
        while (status := _get_from(srv, "127.0.0.2")[0]) != 200:
            assert time.monotonic() < deadline, f"another address still gets {status}"
            time.sleep(0.05)
        # Asking on each: a few 503s saying why, the rest closed unanswered.
        answers = [_answer(_connect(srv)) for _ in range(PER_CLIENT_503S + 12)]
        assert answers.count(503) <= PER_CLIENT_503S and answers.count(None) >= 12, answers
        for sock in held:
            sock.close()
        deadline = time.monotonic() + HANG_S
        while _get_from(srv, "127.0.0.1")[0] != 200:  # its slots back once it lets go
            assert time.monotonic() < deadline, "the address's closed sockets still count"
            time.sleep(0.05)
    finally:
        srv.stop()


def test_the_per_client_cap_leaves_a_local_user_room():
    """Every client of a local server is 127.0.0.1: the default is half the cap, and a cap
    too small to split is not split."""
    assert per_client_cap(ConnectionLimits(), 4096) == 2048
    assert per_client_cap(ConnectionLimits(), 100) == 50
    assert per_client_cap(ConnectionLimits(), 8) == 8
    assert per_client_cap(ConnectionLimits(max_connections_per_client=10), 4096) == 10
    assert per_client_cap(ConnectionLimits(max_connections_per_client=10_000), 4096) == 4096
    with pytest.raises(ValueError, match="max_connections_per_client must be at least 1, got 0"):
        ConnectionLimits(max_connections_per_client=0)


def _child(tiny_gguf: Path, tmp_path: Path, soft: int, hard: int, header_timeout_s: float):
    err = open(tmp_path / "server.err", "w")  # a file, not a pipe: a flood cannot block it
    child = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "fd_limited_server.py"), str(tiny_gguf)]
        + [str(soft), str(hard), str(header_timeout_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
        cwd=REPO,
    )
    err.close()
    return child, tmp_path / "server.err"


def _ask(child, command: str | None = None) -> dict:
    if command is not None:
        child.stdin.write(command + "\n")
        child.stdin.flush()
    line = child.stdout.readline()
    assert line, f"the server process ended (rc {child.poll()})"
    return json.loads(line)


def _flood(port: int, count: int, sent: bytes) -> list[socket.socket]:
    """Open up to `count` sockets, each sending `sent`; a connect the server's full backlog
    leaves waiting is given up after a moment (the kernel drops SYNs past it)."""
    socks = []
    for _ in range(count):
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=0.2)
            sock.sendall(sent)
            socks.append(sock)
        except OSError:
            continue
    return socks


def _health_within(port: int, seconds: float) -> int:
    """GET /health until it answers 200 (503 while over the cap; no answer while out of
    descriptors), for up to `seconds`; the last status."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            status = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code
        except httpx.HTTPError:
            status = None
        if status == 200 or time.monotonic() > deadline:
            return status
        time.sleep(0.1)


def test_more_sockets_than_descriptors_neither_kill_nor_flood_the_server(tiny_gguf, tmp_path):
    """Under RLIMIT_NOFILE 256 (the soft limit 200 raised to the hard one at start), 300
    half-open sockets: the cap keeps accept() off EMFILE, the deadline frees them, and a
    legitimate request succeeds while they are still held by the client. Then the process's
    other files take every descriptor (accept() does fail): one log line per 10 s, not one
    traceback per failed accept() (63,450 in 4 s before), and it serves once they go."""
    child, err = _child(tiny_gguf, tmp_path, 200, 256, header_timeout_s=4)
    try:
        info = _ask(child)
        assert info["fd_limit"] == 256  # raised from 200 toward the hard limit
        assert info["cap"] + info["overflow"] < 256
        held = _flood(info["port"], 300, b"GET /health HTTP/1.1\r\n")
        assert _ask(child, "fds")["open"] < 256 - 8  # inside the budget, at its peak
        assert _health_within(info["port"], HANG_S) == 200
        for sock in held:
            sock.close()
        log = err.read_text()
        assert "Too many open files" not in log, log[:2000]
        assert "closed a connection at once" in log  # the flood went past cap and overflow
        assert len(log.splitlines()) <= 10, log[:2000]

        deadline = time.monotonic() + HANG_S
        while _ask(child, "fds")["open"] > 20:  # the server lets go of the flood's sockets
            assert time.monotonic() < deadline, "the closed sockets are still held"
            time.sleep(0.1)
        assert _ask(child, "hog")["hogged"] > 0
        held = _flood(info["port"], 30, b"GET /health HTTP/1.1\r\n")
        time.sleep(2.5)  # asyncio retries a failed accept() every second
        log = err.read_text()
        assert 1 <= log.count("socket.accept() out of system resource") <= 2, log[:2000]
        assert len(log.splitlines()) <= 40, log[:4000]
        assert _ask(child, "free") == {"freed": True}
        for sock in held:
            sock.close()
        assert _health_within(info["port"], HANG_S) == 200
        assert _ask(child, "quit") == {"stopped": True}
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)


def test_the_budget_keeps_every_connection_inside_the_descriptor_limit():
    for limit, in_use in [(256, 10), (1024, 60), (4096, 300), (65536, 200), (1 << 20, 50)]:
        budget = connection_budget(limit, in_use)
        # Served + answered 503 + two passes of accepts + what the process holds < the limit.
        assert in_use + budget.cap + budget.overflow + 2 * budget.backlog < limit, budget
        assert budget.cap >= 100, budget
    assert connection_budget(1 << 20, 50).cap == 4096  # the fixed ceiling
    assert connection_budget(64, 60).cap >= 4  # a hopeless limit still serves a few


def test_a_flood_of_one_kind_of_log_line_is_one_line_per_interval():
    now = [0.0]
    limiter = RateLimitFilter(("socket.accept()",), interval_s=10.0, clock=lambda: now[0])

    def passes(message: str) -> logging.LogRecord | None:
        record = logging.LogRecord("asyncio", logging.ERROR, __file__, 1, message, None, None)
        return record if limiter.filter(record) else None

    assert passes("socket.accept() out of system resource")
    for _ in range(1000):
        now[0] += 0.001
        assert not passes("socket.accept() out of system resource")
    assert passes("something else entirely")  # other kinds are not touched
    now[0] = 10.5
    record = passes("socket.accept() out of system resource")
    assert record and "1000 more like this in the last 10 s not logged" in record.getMessage()
