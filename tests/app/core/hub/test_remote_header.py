"""RemoteFile, the byte-range reader the search parses GGUF headers through: what it asks the hub,
the token it sends (and does not send to the CDN), and a server that ignores Range."""

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fake_hub import FakeHub
from huggingface_hub import constants
from tiny_models import make_quant_gguf

from kvscope.app.core.hub.remote_file import RemoteFile
from kvscope.app.core.hub.search import judge_file, list_files
from kvscope.engine.config import EngineConfig
from kvscope.engine.model.gguf.file import read_gguf, read_gguf_header

REPO = "someone/Tiny-GGUF"


@pytest.fixture
def tiny(fake_hub: FakeHub, tmp_path: Path) -> Path:
    path = make_quant_gguf(tmp_path / "tiny-Q8_0.gguf", "Q8_0")
    fake_hub.add_repo(REPO, {path.name: path.read_bytes()})
    return path


def test_ranges_are_asked_once_each(fake_hub: FakeHub, tiny: Path):
    data = tiny.read_bytes()
    remote = RemoteFile(REPO, tiny.name)  # size unknown: the first read learns it
    assert len(remote) == len(data)
    assert (remote.requests, remote.fetched_bytes) == (1, 64 << 10)
    assert remote[10:1000] == data[10:1000]  # within the first read: no request
    assert remote[60_000:70_000] == data[60_000:70_000]  # only the bytes not read yet
    assert (remote.requests, remote.fetched_bytes) == (2, (64 << 10) + 70_000 - (64 << 10))
    assert remote[len(data) - 10 : len(data) + 50] == data[-10:]  # clipped at the end
    ranges = [r.headers["Range"] for r in fake_hub.requests if r.path.startswith("/cdn/")]
    assert ranges == [
        "bytes=0-65535",
        "bytes=65536-69999",
        f"bytes={len(data) - 10}-{len(data) - 1}",
    ]


def test_a_gated_file_is_read_with_the_token_which_stays_off_the_cdn(
    fake_hub: FakeHub, tiny: Path, monkeypatch: pytest.MonkeyPatch
):
    fake_hub.add_repo("corp/Gated-GGUF", {tiny.name: tiny.read_bytes()}, gated=True)
    fake_hub.grant("corp/Gated-GGUF", "hf_secret")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    [hub_file] = list_files("corp/Gated-GGUF")
    fake_hub.reset_counts()

    verdict = judge_file(hub_file, EngineConfig(device="cpu"))

    assert verdict.runnable and verdict.max_context == 512
    # File requests only: the tree listing's may be recorded after reset_counts.
    auth = [
        (r.path.split("/")[1], {k.lower(): v for k, v in r.headers.items()}.get("authorization"))
        for r in fake_hub.requests
        if "/resolve/" in r.path or r.path.startswith("/cdn/")
    ]
    assert ("corp", "Bearer hf_secret") in auth and ("cdn", "Bearer hf_secret") not in auth
    assert {path for path, token in auth} == {"corp", "cdn"}
    assert all(token is None for path, token in auth if path == "cdn")


class _RangeIgnoringServer(ThreadingHTTPServer):
    """Answers every GET with the whole file (200), as a server without Range support does;
    counts the bytes it managed to send before the client hung up."""

    daemon_threads = True

    def __init__(self, data: bytes) -> None:
        super().__init__(("127.0.0.1", 0), _WholeFileHandler)
        self.data, self.sent, self.done = data, 0, threading.Event()


class _WholeFileHandler(BaseHTTPRequestHandler):
    server: _RangeIgnoringServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
        """Quiet."""

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        data = self.server.data
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            for start in range(0, len(data), 1 << 16):
                self.wfile.write(data[start : start + (1 << 16)])
                self.server.sent += min(1 << 16, len(data) - start)
        except OSError:
            pass  # the client closed the connection: what a header read should do
        finally:
            self.server.done.set()


@pytest.fixture
def range_ignoring_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[_RangeIgnoringServer, bytes, Path]]:
    path = make_quant_gguf(tmp_path / "tiny-Q8_0.gguf", "Q8_0")
    data = path.read_bytes() + bytes(256 << 20)  # a 256 MB tail that must not be downloaded
    server = _RangeIgnoringServer(data)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield server, data, path
    server.shutdown()
    server.server_close()


def test_a_server_ignoring_range_is_read_only_as_far_as_the_header(range_ignoring_hub):
    server, data, path = range_ignoring_hub
    remote = RemoteFile(REPO, path.name, size=len(data))

    header = read_gguf_header(remote, path.name)

    assert header.metadata == read_gguf(path).metadata
    assert server.done.wait(10)
    # Each read stops at its bytes and hangs up; socket buffers let a few MB more go out.
    assert remote.fetched_bytes <= 1 << 20
    assert server.sent < 32 << 20 < len(data)
