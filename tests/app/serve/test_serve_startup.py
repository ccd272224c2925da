"""`kvscope serve` takes its port at once: /health says "starting" and which stage while the
engine is built, other routes answer 503 with Retry-After, then the real server answers. A load
that fails is said and ends the command with exit code 2."""

import socket
import threading

import httpx
import pytest
import uvicorn

from kvscope.app.cli.main import build_parser
from kvscope.app.core import engine_flags
from kvscope.app.serve import serve_command
from kvscope.engine import LLM


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            answer = predicate()
        except httpx.HTTPError:
            answer = None
        if answer:
            return answer
        time.sleep(0.05)
    raise AssertionError("timed out")


@pytest.fixture
def servers(monkeypatch):
    """The uvicorn servers `run` makes, so a test can stop them."""
    made: list[uvicorn.Server] = []

    class Recorded(uvicorn.Server):
        def __init__(self, config):  # type: ignore[no-untyped-def]
            super().__init__(config)
            made.append(self)

    monkeypatch.setattr(serve_command.uvicorn, "Server", Recorded)
    return made


def test_health_says_starting_until_the_engine_is_built(
    default_model, monkeypatch, servers, capsys
):
    gate = threading.Event()

    def slow_build(args, progress):  # type: ignore[no-untyped-def]
        progress("reading the model's header and tokenizer")
        gate.wait(60)
        return LLM(model=default_model, device="cpu", num_kv_blocks=32, max_model_len=256)

    monkeypatch.setattr(engine_flags, "llm_from_args", slow_build)
    port = free_port()
    args = build_parser().parse_args(["serve", "--port", str(port)])
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(serve_command.run(args)), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    health = wait_for(lambda: httpx.get(f"{url}/health", timeout=2))
    assert health.status_code == 503
    assert health.json()["status"] == "starting"
    assert health.json()["stage"] == "reading the model's header and tokenizer"
    models = httpx.get(f"{url}/v1/models", timeout=2)
    assert models.status_code == 503 and models.headers["retry-after"] == "2"
    assert "the server is starting (reading the model" in models.json()["error"]["message"]
    gate.set()
    wait_for(lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200)
    assert httpx.get(f"{url}/v1/models", timeout=5).json()["data"][0]["max_model_len"] == 256
    servers[0].should_exit = True
    thread.join(30)
    assert codes == [0]
    err = capsys.readouterr().err
    assert "/health answers 503 'starting'" in err and "(ready in" in err


def test_a_load_that_fails_is_said_and_exits_2(monkeypatch, servers, capsys):
    def missing(args, progress):  # type: ignore[no-untyped-def]
        raise FileNotFoundError("model path does not exist: /nowhere.gguf")

    monkeypatch.setattr(engine_flags, "llm_from_args", missing)
    args = build_parser().parse_args(["serve", "--port", str(free_port())])
    assert serve_command.run(args) == 2
    assert "error: model path does not exist: /nowhere.gguf" in capsys.readouterr().err


def test_a_bad_flag_is_said_before_the_port_is_taken(servers, capsys):
    args = build_parser().parse_args(["serve", "--port", str(free_port()), "--max-model-len", "1"])
    assert serve_command.run(args) == 2
    assert servers == []  # no server was made
    assert "error: max_model_len must be >= 2, got 1" in capsys.readouterr().err
