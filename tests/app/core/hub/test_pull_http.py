"""The pull's body reader (http_get) where a user's network differs from a straight line: an
HTTP proxy from the environment, `NO_PROXY`, and the token kept off a redirect's other host."""

import hashlib
import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
from fake_hub import FakeHub
from huggingface_hub.utils import close_session

from kvscope.app.core.hub.http_get import HttpTransportError, open_get
from kvscope.app.core.hub.pull import Pull

MIB = 1 << 20
REPO = "org/Proxied-GGUF"
FILE = "Proxied-Q4_K_M.gguf"


class ForwardingProxy(ThreadingHTTPServer):
    """A plain-http forward proxy: takes `GET http://host:port/path`, relays it, records it."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.seen: list[tuple[str, dict[str, str]]] = []

    @property
    def url(self) -> str:
        return f"http://user:p%40ss@127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ForwardingProxy

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib's name
        """Quiet."""

    def do_GET(self) -> None:  # noqa: N802 - stdlib's name
        self.server.seen.append((self.path, dict(self.headers.items())))
        target = urlsplit(self.path)
        upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=10)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "proxy-authorization"}
        upstream.request(
            "GET", target.path + (f"?{target.query}" if target.query else ""), headers=headers
        )
        answer = upstream.getresponse()
        body = answer.read()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        upstream.close()


@pytest.fixture
def proxy() -> Iterator[ForwardingProxy]:
    """The proxy, with huggingface_hub's shared client rebuilt on both sides of the test: it
    reads the proxy environment once, when it is made."""
    server = ForwardingProxy()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    close_session()
    yield server
    close_session()
    server.shutdown()
    server.server_close()


def publish(hub: FakeHub, size: int) -> bytes:
    data = hashlib.shake_256(b"proxied").digest(size)
    hub.add_repo(REPO, {FILE: data})
    return data


def test_the_body_goes_through_the_proxy_the_environment_names(
    fake_hub: FakeHub, proxy: ForwardingProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = publish(fake_hub, 2 * MIB + 5)
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("http_proxy", proxy.url)
    path = Pull(REPO).run()
    assert path.read_bytes() == data
    bodies = [(line, headers) for line, headers in proxy.seen if "/cdn/" in line]
    assert bodies, proxy.seen
    line, headers = bodies[0]
    assert line.startswith(fake_hub.cdn_url + "/cdn/")  # the proxy was sent the whole URL
    assert headers["Proxy-Authorization"] == "Basic dXNlcjpwQHNz"  # user:p@ss, unquoted
    assert headers["Range"] == "bytes=0-"


def test_no_proxy_sends_a_host_straight(
    fake_hub: FakeHub, proxy: ForwardingProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = publish(fake_hub, MIB)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("http_proxy", proxy.url)
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    monkeypatch.setenv("no_proxy", "localhost,127.0.0.1")
    assert Pull(REPO).run().read_bytes() == data
    assert [line for line, _ in proxy.seen if "/cdn/" in line] == []


def test_a_redirect_to_another_host_drops_the_token(fake_hub: FakeHub) -> None:
    publish(fake_hub, 1000)
    url = f"{fake_hub.url}/{REPO}/resolve/main/{FILE}"
    body = open_get(url, {"Authorization": "Bearer hf_secret", "X-Kept": "yes"}, 5, 5)
    try:
        assert body.status == 200 and urlsplit(body.url).hostname == "localhost"
    finally:
        body.close()
    resolve, cdn = [r for r in fake_hub.requests if FILE in r.path or "/cdn/" in r.path][-2:]
    assert resolve.headers.get("Authorization") == "Bearer hf_secret"
    assert "Authorization" not in cdn.headers and cdn.headers.get("X-Kept") == "yes"


def test_a_refused_connection_is_a_connect_error() -> None:
    with socket_that_refuses() as port:
        with pytest.raises(HttpTransportError) as refused:
            open_get(f"http://127.0.0.1:{port}/file", {}, 2, 2)
    assert refused.value.kind == "connect"


class socket_that_refuses:  # noqa: N801 - used as a context manager
    """A port nothing listens on (bound, never listening, so nobody else takes it meanwhile)."""

    def __enter__(self) -> int:
        import socket

        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        return int(self._socket.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self._socket.close()
