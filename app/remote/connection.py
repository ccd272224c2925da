"""Connection: where one remote server is, and how to reach its KV events.

A user gives a base URL ("http://gpu-box:8000", with or without "/v1"), optionally the ZMQ
endpoint of the server's KV events (vLLM's `--kv-events-config '{"endpoint": ...}'`; the app
connects where vLLM binds) and its replay endpoint, an API key, and vLLM's PYTHONHASHSEED when
its block hashes should be reproduced (app/remote/routing.py)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit


class ConnectionSpecError(ValueError):
    """A connection the user typed cannot be used; the message names the bad part."""


@dataclass(frozen=True)
class Connection:
    url: str  # normalised base: "http://host:port" (no trailing slash, no "/v1")
    kv_events: str | None = None  # "tcp://host:5557": the PUB socket to subscribe to
    kv_replay: str | None = None  # "tcp://host:5558": the ROUTER socket that replays
    api_key: str = ""
    topic: str = ""  # ZMQ topic prefix; "" takes every topic
    name: str = ""  # what the app calls this replica; default host:port
    hash_seed: str | None = None  # vLLM's PYTHONHASHSEED, if known

    @property
    def label(self) -> str:
        return self.name or urlsplit(self.url).netloc

    @property
    def api_base(self) -> str:
        """The OpenAI base URL: url + "/v1"."""
        return self.url + "/v1"


def _zmq_endpoint(value: str | None, what: str) -> str | None:
    if value is None or not value.strip():
        return None
    value = value.strip()
    parts = urlsplit(value)
    if parts.scheme not in ("tcp", "ipc") or not (parts.netloc or parts.path):
        raise ConnectionSpecError(
            f"{what} must be a ZMQ endpoint like tcp://host:5557, got {value!r}"
        )
    if parts.scheme == "tcp":
        host, _, port = parts.netloc.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConnectionSpecError(f"{what} needs a host and a port 1-65535, got {value!r}")
    return value


def parse_connection(
    url: str,
    kv_events: str | None = None,
    kv_replay: str | None = None,
    api_key: str = "",
    topic: str = "",
    name: str = "",
    hash_seed: str | None = None,
) -> Connection:
    """Check and normalise what a user typed; raises ConnectionSpecError naming the bad part."""
    raw = (url or "").strip()
    if not raw:
        raise ConnectionSpecError("a server URL is needed, e.g. http://127.0.0.1:8000")
    if "://" not in raw:
        raw = "http://" + raw
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https"):
        raise ConnectionSpecError(
            f"the server URL must start with http:// or https://, got {url!r}"
        )
    if not parts.hostname:
        raise ConnectionSpecError(f"the server URL has no host: {url!r}")
    try:
        port = parts.port
    except ValueError:
        raise ConnectionSpecError(
            f"the server URL's port is not a number 0-65535: {url!r}"
        ) from None
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    netloc = parts.hostname if port is None else f"{parts.hostname}:{port}"
    if ":" in parts.hostname:  # IPv6 literal
        netloc = f"[{parts.hostname}]" + ("" if port is None else f":{port}")
    return Connection(
        url=f"{parts.scheme}://{netloc}{path}",
        kv_events=_zmq_endpoint(kv_events, "the KV events endpoint"),
        kv_replay=_zmq_endpoint(kv_replay, "the KV events replay endpoint"),
        api_key=api_key.strip(),
        topic=topic,
        name=name.strip(),
        hash_seed=hash_seed if hash_seed not in ("",) else None,
    )
