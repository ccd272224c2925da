"""Two `kvscope serve` processes as two replicas, watched the way the app's remote view watches
vLLM: a shared system prompt sent to replica "a" must show up as "a"'s blocks (from its KV
events, replayed from seq 0 on connect), the routing prediction for a new prompt with the same
system prompt must say "a" holds its leading blocks and "b" none, and "a" must then really serve
that many prompt tokens from its cache. Then "b" is killed (shown as down, its cache kept as last
seen), and restarted on the same ports (shown as a restart, its cache started over)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from remote_fakes import wait_until
from repo_paths import REPO as ROOT

from kvscope.app.remote.connection import parse_connection
from kvscope.app.remote.monitor import ReplicaMonitor
from kvscope.app.remote.openai_http import OpenAIHttp
from kvscope.app.remote.routing import predict_hits
from kvscope.engine.child_python import python_module_command

BLOCK_SIZE = 16
START_TIMEOUT_S = 240
SYSTEM = (
    "You are the release assistant of the KVScope project. Answer in one short sentence, name "
    "the component you mean, and never invent version numbers or dates that you were not given."
)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Replica:
    def __init__(self, name: str, tmp: Path) -> None:
        self.name = name
        self.http, self.pub, self.replay = _free_ports(3)
        self.log = tmp / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def connection(self):
        return parse_connection(
            f"http://127.0.0.1:{self.http}",
            kv_events=f"tcp://127.0.0.1:{self.pub}",
            kv_replay=f"tcp://127.0.0.1:{self.replay}",
            name=self.name,
        )

    def start(self) -> Replica:
        args = [
            *python_module_command("kvscope.app.cli"), "serve", "--port", str(self.http),
            "--kv-events", f"tcp://127.0.0.1:{self.pub}",
            "--kv-events-replay", f"tcp://127.0.0.1:{self.replay}",
            "--block-size", str(BLOCK_SIZE), "--num-kv-blocks", "96", "--max-model-len", "512",
            "--num-threads", "1",
        ]  # fmt: skip
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=self.log.open("wb"), stderr=subprocess.STDOUT
        )
        return self

    def wait_up(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{self.http}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"replica {self.name} did not start:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def _wait(what: str, predicate, timeout: float = 30.0):
    return wait_until(predicate, timeout, what)


@pytest.fixture
def replicas(tmp_path):
    pair = [Replica("a", tmp_path).start(), Replica("b", tmp_path).start()]
    try:
        for r in pair:
            r.wait_up()
        yield pair
    finally:
        for r in pair:
            r.kill()


def _chat(client: OpenAIHttp, model: str, question: str) -> list:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return list(client.stream_chat(model, messages, {"max_tokens": 4, "temperature": 0.0}))


def _messages(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def test_two_replicas_attribution_routing_and_restart(replicas):
    a, b = replicas
    monitors = {r.name: ReplicaMonitor(r.connection, poll_s=0.3).start() for r in replicas}
    clients = {r.name: OpenAIHttp(r.connection, timeout=120) for r in replicas}
    try:
        model = clients["a"].models()[0]
        assert clients["b"].models() == [model]
        # Both live and empty before anything is sent.
        for name, mon in monitors.items():
            _wait(f"{name} up", lambda m=mon: m.snapshot().http_state == "up")
            _wait(f"{name} events", lambda m=mon: m.snapshot().status.state in ("live", "silent"))
            assert monitors[name].snapshot().cache.num_blocks == 0

        deltas = _chat(clients["a"], model, "Which component draws the block map?")
        assert any(d.text for d in deltas)
        first_prompt = clients["a"].tokenize(
            model, _messages("Which component draws the block map?")
        )
        full_blocks = len(first_prompt) // BLOCK_SIZE
        assert full_blocks >= 3
        snap_a = _wait(
            "a's blocks",
            lambda: (s := monitors["a"].snapshot()).cache.num_blocks >= full_blocks and s,
        )
        assert monitors["b"].snapshot().cache.num_blocks == 0
        assert snap_a.block_size == BLOCK_SIZE
        # Our server publishes vLLM's sha256 hashes with vLLM's fixed seed: reproducible.
        assert snap_a.hasher is not None and "sha256" in snap_a.hash_note

        # The routing question for a new prompt with the same system prompt.
        question = "Which component replays a recorded session?"
        tokens = {name: c.tokenize(model, _messages(question)) for name, c in clients.items()}
        common = 0
        for x, y in zip(first_prompt, tokens["a"], strict=False):
            if x != y:
                break
            common += 1
        expected = common // BLOCK_SIZE
        assert expected >= 2
        snaps = {name: m.snapshot() for name, m in monitors.items()}
        hits = predict_hits(
            tokens,
            {n: s.cache for n, s in snaps.items()},
            {n: s.hasher for n, s in snaps.items()},
            {n: s.block_size for n, s in snaps.items()},
        )
        assert [h.replica for h in hits] == ["a", "b"]
        assert hits[0].blocks_held == expected and hits[0].method == "hash (sha256)"
        assert hits[1].blocks_held == 0
        # The prediction is what replica "a" then really serves from its prefix cache.
        cached = [d.cached_tokens for d in _chat(clients["a"], model, question)]
        assert [c for c in cached if c is not None] == [expected * BLOCK_SIZE]

        # "b" goes away: shown down, "a" unaffected.
        held_before = monitors["b"].snapshot().cache.num_blocks
        b.kill()
        down = _wait("b down", lambda: (s := monitors["b"].snapshot()).http_state == "down" and s)
        assert down.http_error and down.cache.num_blocks == held_before
        assert monitors["a"].snapshot().http_state == "up"
        # "b" comes back on the same ports, is used, and is seen as restarted.
        b.start().wait_up()
        _chat(clients["b"], model, "Which component draws the block map?")
        back = _wait(
            "b restarted",
            lambda: (
                (s := monitors["b"].snapshot()).http_state == "up"
                and s.status.restarts + s.cache.clears >= 1
                and s.cache.num_blocks >= full_blocks
                and s
            ),
            timeout=60,
        )
        assert back.status.state in ("live", "silent")
    finally:
        for c in clients.values():
            c.close()
        for m in monitors.values():
            m.stop()
