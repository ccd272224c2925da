"""One streamed HTTP(S) GET on the standard library, for a download's body bytes.

The body is read with `readinto` into the caller's buffers, a megabyte per call: huggingface_hub's
client yields 64 KiB `bytes` objects through several layers, which on loopback held a pull to
about half of what the socket gives. Everything around the body (search, listing, hashes, the
errors' wording) stays on huggingface_hub.

What a download needs from a client, and this one does:
- redirects (the hub answers a file with a 302 to its CDN), up to `_MAX_REDIRECTS`, dropping the
  `Authorization` header once a redirect leaves the host it was sent to, as httpx and requests do;
- the proxy environment (`HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`, through urllib's reading of it),
  with a CONNECT tunnel for https and credentials in the proxy URL;
- TLS verified against the system's certificates (and certifi's, where installed);
- a connect timeout, and a read timeout that is the stall timeout: no byte for that long fails;
- the socket, so another thread can shut it to stop a blocked read (pause, cancel).
"""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from urllib.parse import unquote, urljoin, urlsplit

_MAX_REDIRECTS = 10
_REDIRECT_STATUSES = (301, 302, 303, 307, 308)


class HttpTransportError(Exception):
    """The connection failed: `kind` is "connect", "stall" (no byte within the read timeout) or
    "dropped" (closed or reset before the body ended)."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(why)
        self.kind = kind


@dataclass
class HttpBody:
    """An answered GET: status and headers read, the body still on the socket."""

    url: str  # after redirects
    status: int
    headers: http.client.HTTPMessage
    _connection: http.client.HTTPConnection
    _response: http.client.HTTPResponse

    @property
    def socket(self) -> socket.socket | None:
        return self._connection.sock

    def readinto(self, buffer: memoryview) -> int:
        """Up to len(buffer) body bytes, from at most one read of the socket (what has arrived:
        a stall or a kill then loses nothing already received); 0 at the body's end, or once
        the socket was shut."""
        response = self._response
        try:
            if response.chunked or response.length is None or response.fp is None:
                data = response.read1(len(buffer))
                buffer[: len(data)] = data
                return len(data)
            # HTTPResponse.readinto fills the whole buffer before it returns; readinto1 on its
            # file is one system call, with the body's remaining length kept as read1 keeps it.
            want = min(len(buffer), response.length)
            count = response.fp.readinto1(buffer[:want]) if want else 0
            response.length -= count
            return count
        except TimeoutError as error:
            raise HttpTransportError("stall", str(error) or "timed out") from error
        except (OSError, http.client.HTTPException) as error:
            raise HttpTransportError("dropped", str(error) or type(error).__name__) from error

    def read_all(self, limit: int = 1 << 20) -> bytes:
        """The rest of a short body (an error page), at most `limit` bytes."""
        try:
            return self._response.read(limit)
        except (OSError, http.client.HTTPException):
            return b""

    def close(self) -> None:
        self._connection.close()


def open_get(
    url: str, headers: Mapping[str, str], connect_timeout_s: float, read_timeout_s: float
) -> HttpBody:
    """GET `url` and follow its redirects; returns once the final answer's headers are in.
    Raises HttpTransportError when a connection fails on the way."""
    sent = dict(headers)
    for _ in range(_MAX_REDIRECTS + 1):
        body = _get_once(url, sent, connect_timeout_s, read_timeout_s)
        location = body.headers.get("Location")
        if body.status not in _REDIRECT_STATUSES or not location:
            return body
        body.close()
        target = urljoin(url, location)
        if urlsplit(target).netloc.lower() != urlsplit(url).netloc.lower():
            sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}
        url = target
    raise HttpTransportError("connect", f"more than {_MAX_REDIRECTS} redirects from {url}")


def _get_once(
    url: str, headers: dict[str, str], connect_timeout_s: float, read_timeout_s: float
) -> HttpBody:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HttpTransportError("connect", f"not an http(s) URL: {url}")
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    proxy = _proxy_for(parts.scheme, parts.hostname)
    request_headers = {"Host": parts.netloc, **headers}
    if proxy is None:
        connection = _connection(parts.scheme, parts.hostname, parts.port, connect_timeout_s)
    else:
        proxy_parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        proxy_auth = _proxy_authorization(proxy_parts.username, proxy_parts.password)
        # The proxy is spoken to in plain http, as urllib does: an https URL goes through a
        # CONNECT tunnel (TLS inside it, checked against the origin's name), an http URL is
        # sent to the proxy whole.
        connection = _connection(
            parts.scheme, proxy_parts.hostname or "", proxy_parts.port, connect_timeout_s
        )
        if parts.scheme == "https":
            connection.set_tunnel(parts.hostname, parts.port or 443, proxy_auth)
        else:
            target = url
            request_headers.update(proxy_auth)
    try:
        connection.connect()
        if connection.sock is not None:
            connection.sock.settimeout(read_timeout_s)
        connection.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
        for name, value in request_headers.items():
            connection.putheader(name, value)
        connection.endheaders()
        response = connection.getresponse()
    except TimeoutError as error:
        connection.close()
        raise HttpTransportError("stall", str(error) or "timed out") from error
    except ssl.SSLCertVerificationError as error:
        connection.close()
        raise HttpTransportError("connect", f"TLS certificate check failed: {error}") from error
    except (OSError, http.client.HTTPException) as error:
        kind = "connect" if connection.sock is None else "dropped"
        connection.close()
        raise HttpTransportError(kind, str(error) or type(error).__name__) from error
    return HttpBody(url, response.status, response.headers, connection, response)


def _connection(
    scheme: str, host: str, port: int | None, timeout_s: float
) -> http.client.HTTPConnection:
    if scheme == "https":
        return http.client.HTTPSConnection(host, port, timeout=timeout_s, context=_tls_context())
    return http.client.HTTPConnection(host, port, timeout=timeout_s)


def _proxy_for(scheme: str, host: str) -> str | None:
    """The proxy urllib would use for this scheme and host (environment, or the OS settings)."""
    if urllib.request.proxy_bypass(host):
        return None
    return urllib.request.getproxies().get(scheme)


def _proxy_authorization(user: str | None, password: str | None) -> dict[str, str]:
    if user is None:
        return {}
    token = base64.b64encode(f"{unquote(user)}:{unquote(password or '')}".encode()).decode()
    return {"Proxy-Authorization": f"Basic {token}"}


@cache
def _tls_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    try:
        import certifi
    except ImportError:
        return context
    context.load_verify_locations(certifi.where())
    return context
