"""A loopback Hugging Face Hub for tests: the HTTP that `huggingface_hub` and our pull speak.

It answers what the real hub answers for model repos, in the shapes `huggingface_hub` parses:

- `GET /api/models` (search: `filter`, `search`, `author`, `sort`, `limit`, `expand`, `full`,
  `cardData`), `GET /api/models/{repo}[/revision/{rev}]` (`blobs=True` adds sizes and LFS
  sha256), `GET /api/models/{repo}/tree/{rev}[/{path}]` (`recursive`);
- `HEAD`/`GET /{repo}/resolve/{rev}/{file}` with `X-Repo-Commit`, `ETag`, `X-Linked-Etag`,
  `X-Linked-Size`; an LFS file answers 302 to a "CDN" URL on another host name (`localhost` instead
  of `127.0.0.1`, the same server) as the real hub does, so clients drop the token there;
- `Range: bytes=a-[b]` -> 206 with `Content-Range`, an unsatisfiable range -> 416;
- errors with the hub's `X-Error-Code`: a missing repo is 401 without a token and 404 with one
  (RepoNotFound), a missing file 404 (EntryNotFound, with `X-Repo-Commit`), a missing revision
  404 (RevisionNotFound), a gated repo 401 without a token and 403 with a token not granted
  (GatedRepo). Metadata of gated repos stays readable, as on the real hub.

Fault knobs per file (`set_faults`) act on the bytes of file content responses: a connection cut
at an offset, a stall at an offset, a flipped byte, a status instead of the file, a rate limit.
`bytes_served` counts the body bytes sent per file, for resume checks; `requests` lists what was
asked (method, path, headers, status); `grant` lets a token read a gated repo; `cdn_redirect =
False` serves LFS content from /resolve itself. `env(hf_home)` is the environment for a child
process; `point_huggingface_hub_at` points this process's huggingface_hub at the hub.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pytest
from fake_hub_api import (
    card,
    details,
    directory_entry,
    expanded,
    file_entry,
    flag,
    sibling,
    sort_key,
    summary,
)
from fake_hub_repos import Faults, HubFile, HubRepo, SeenRequest, git_blob_oid

_SEND_BLOCK = 1 << 20
# Files whose names end so are stored in git, not LFS, as on the real hub (small text files).
_GIT_STORED_SUFFIXES = (".md", ".json", ".txt", ".gitattributes", ".yaml", ".yml")


class FakeHub:
    """A threaded loopback HTTP server that behaves like huggingface.co for model repos."""

    def __init__(self) -> None:
        self._repos: dict[str, HubRepo] = {}
        self._faults: dict[tuple[str, str], Faults] = {}
        self._served: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._connections: set[socket.socket] = set()
        self._thread: threading.Thread | None = None
        self.requests: list[SeenRequest] = []
        self.url = ""
        self.cdn_url = ""
        # The real hub sends LFS content from a CDN host; False serves it from /resolve directly.
        self.cdn_redirect = True

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> FakeHub:
        """Listen on a free loopback port; returns self so `FakeHub().start()` reads well."""
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        server.daemon_threads = True
        port = server.server_address[1]
        self._server = server
        self.url = f"http://127.0.0.1:{port}"
        self.cdn_url = f"http://localhost:{port}"
        # A short poll keeps stop() (which waits for the serving loop to notice) quick.
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.02,), name="fake-hub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, kept-alive connections included; stalled responses wake up and close."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        with self._lock:
            open_connections = list(self._connections)
        for connection in open_connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- content --------------------------------------------------------------------------------

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes],
        *,
        gated: bool = False,
        downloads: int = 0,
        likes: int = 0,
        license: str | None = None,
        tags: list[str] | None = None,
        last_modified: str = "2026-11-01T00:00:00.000Z",
    ) -> str:
        """Publish (or replace) a repo; returns its commit sha. `tags` defaults to ["gguf"]."""
        hub_files = {
            path: HubFile(
                path=path,
                data=data,
                sha256=hashlib.sha256(data).hexdigest(),
                git_oid=git_blob_oid(data),
                lfs=not path.endswith(_GIT_STORED_SUFFIXES),
            )
            for path, data in files.items()
        }
        listing = "\n".join(f"{f.path} {f.sha256}" for f in sorted(hub_files.values(), key=_path))
        commit = hashlib.sha1(f"{repo_id}\n{listing}".encode()).hexdigest()
        all_tags = list(["gguf"] if tags is None else tags)
        if license is not None:
            all_tags.append(f"license:{license}")
        with self._lock:
            self._repos[repo_id] = HubRepo(
                repo_id=repo_id,
                commit=commit,
                files=hub_files,
                gated=gated,
                downloads=downloads,
                likes=likes,
                license=license,
                tags=all_tags,
                last_modified=last_modified,
            )
        return commit

    def grant(self, repo_id: str, token: str) -> None:
        """Let `token` read a gated repo (the user accepted its licence)."""
        with self._lock:
            self._repos[repo_id].granted_tokens.add(token)

    def set_faults(self, repo_id: str, path: str, **knobs: Any) -> Faults:
        """Replace the faults of one file; knobs are `Faults` fields."""
        faults = Faults(**knobs)
        with self._lock:
            self._faults[(repo_id, path)] = faults
        return faults

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def bytes_served(self, path: str, repo_id: str | None = None) -> int:
        """Body bytes sent for a file (HEADs excluded), summed over repos unless one is named."""
        with self._lock:
            return sum(
                count
                for (repo, file), count in self._served.items()
                if file == path and (repo_id is None or repo == repo_id)
            )

    def reset_counts(self) -> None:
        with self._lock:
            self._served.clear()
            self.requests.clear()

    def env(self, hf_home: Path) -> dict[str, str]:
        """Environment for a child process that must use this hub and a cache under `hf_home`."""
        return {
            "HF_ENDPOINT": self.url,
            "HF_HOME": str(hf_home),
            "HF_HUB_CACHE": str(hf_home / "hub"),
            "HF_HUB_OFFLINE": "0",
            "HF_TOKEN": "",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_HUB_DISABLE_XET": "1",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }

    # -- helpers for the handler ----------------------------------------------------------------

    def _repo(self, repo_id: str) -> HubRepo | None:
        with self._lock:
            return self._repos.get(repo_id)

    def _repos_snapshot(self) -> list[HubRepo]:
        with self._lock:
            return list(self._repos.values())

    def _take_faults(self, repo_id: str, path: str) -> Faults:
        """The faults for this response; counts one use of the one-shot knobs."""
        with self._lock:
            faults = self._faults.get((repo_id, path))
            if faults is None:
                return Faults()
            this_response = Faults(
                corrupt_at=faults.corrupt_at, rate_bytes_per_s=faults.rate_bytes_per_s
            )
            one_shot = (faults.drop_after_bytes, faults.stall_after_bytes, faults.status)
            if faults.times > 0 and any(knob is not None for knob in one_shot):
                faults.times -= 1
                this_response.drop_after_bytes = faults.drop_after_bytes
                this_response.stall_after_bytes = faults.stall_after_bytes
                this_response.stall_s = faults.stall_s
                this_response.status = faults.status
            return this_response

    def _count(self, repo_id: str, path: str, sent: int) -> None:
        with self._lock:
            self._served[(repo_id, path)] = self._served.get((repo_id, path), 0) + sent

    def _record(self, seen: SeenRequest) -> None:
        with self._lock:
            self.requests.append(seen)


def _path(hub_file: HubFile) -> str:
    return hub_file.path


_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class _Reply(Exception):
    """An error answer: status, hub error code and message, extra headers."""

    def __init__(
        self, status: int, code: str | None, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(_HubHandler):
        pass

    Handler.hub = hub
    return Handler


class _HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    _seen: SeenRequest | None = None
    # Headers and body go out in two writes: with Nagle on, the body would wait for the
    # client's delayed ACK of the headers (40 ms a response), as no real hub makes it.
    disable_nagle_algorithm = True
    hub: FakeHub

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        """Quiet: tests read `hub.requests` instead."""

    def setup(self) -> None:
        super().setup()
        with self.hub._lock:
            self.hub._connections.add(self.connection)

    def finish(self) -> None:
        with self.hub._lock:
            self.hub._connections.discard(self.connection)
        super().finish()

    # -- dispatch -------------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self._dispatch(head=False)

    def do_HEAD(self) -> None:  # noqa: N802 - the stdlib's name
        self._dispatch(head=True)

    def _dispatch(self, head: bool) -> None:
        split = urlsplit(self.path)
        query = parse_qs(split.query)
        path = unquote(split.path)
        # Logged as it arrives (requests keep their order); send_response fills in the status.
        self._seen = SeenRequest(self.command, self.path, dict(self.headers.items()), 0)
        self.hub._record(self._seen)
        try:
            if path.startswith("/api/models"):
                self._api(path, query)
            elif path.startswith("/cdn/"):
                self._cdn(path, head)
            elif "/resolve/" in path:
                self._resolve(path, head)
            else:
                raise _Reply(404, None, "Sorry, we can't find the page you are looking for.")
        except _Reply as reply:
            self._send_error(reply)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def send_response(self, code: int, message: str | None = None) -> None:
        super().send_response(code, message)
        if self._seen is not None:  # None for a request too malformed to reach _dispatch
            self._seen.status = code

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return auth.removeprefix("Bearer ").strip() or None

    def _repo_or_reply(self, repo_id: str) -> HubRepo:
        repo = self.hub._repo(repo_id)
        if repo is None:
            # The real hub answers 401 to anonymous requests for repos it will not name.
            raise _Reply(404 if self._token() else 401, "RepoNotFound", "Repository not found")
        return repo

    def _check_revision(self, repo: HubRepo, revision: str) -> None:
        if revision not in ("main", repo.commit):
            raise _Reply(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    def _check_access(self, repo: HubRepo) -> None:
        if not repo.gated:
            return
        token = self._token()
        if token is None:
            raise _Reply(
                401,
                "GatedRepo",
                f"Access to model {repo.repo_id} is restricted. You must have access to it and be"
                " authenticated to access it. Please log in.",
            )
        if token not in repo.granted_tokens:
            raise _Reply(
                403,
                "GatedRepo",
                f"Access to model {repo.repo_id} is restricted and you are not in the authorized"
                f" list. Visit {self.hub.url}/{repo.repo_id} to ask for access.",
            )

    # -- /api -----------------------------------------------------------------------------------

    def _api(self, path: str, query: dict[str, list[str]]) -> int:
        parts = path.strip("/").split("/")  # api, models, ns, name, ...
        if len(parts) == 2:
            return self._send_json(self._search(query))
        if len(parts) < 4:
            raise _Reply(404, None, "Not found")
        repo = self._repo_or_reply(f"{parts[2]}/{parts[3]}")
        rest = parts[4:]
        if not rest:
            return self._send_json(self._info(repo, query, "main"))
        if rest[0] == "revision" and len(rest) == 2:
            return self._send_json(self._info(repo, query, rest[1]))
        if rest[0] == "tree" and len(rest) >= 2:
            self._check_revision(repo, rest[1])
            return self._send_json(self._tree(repo, "/".join(rest[2:]), query))
        raise _Reply(404, None, "Not found")

    def _search(self, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        repos = self.hub._repos_snapshot()
        wanted_tags = query.get("filter", [])
        repos = [r for r in repos if all(t in r.tags for t in wanted_tags)]
        if "search" in query:
            terms = query["search"][0].lower().split()
            repos = [r for r in repos if all(t in r.repo_id.lower() for t in terms)]
        if "author" in query:
            repos = [r for r in repos if r.repo_id.split("/")[0] == query["author"][0]]
        sort = query.get("sort", ["trendingScore"])[0]
        repos.sort(key=lambda r: sort_key(r, sort), reverse=True)
        if "limit" in query:
            repos = repos[: int(query["limit"][0])]
        full = flag(query, "full")
        rows = []
        for repo in repos:
            row = summary(repo)
            if full:
                row.update(details(repo))
                row["siblings"] = [{"rfilename": p} for p in sorted(repo.files)]
            if flag(query, "cardData"):
                row["cardData"] = card(repo)
            rows.append(expanded(row, repo, query))
        return rows

    def _info(self, repo: HubRepo, query: dict[str, list[str]], revision: str) -> dict[str, Any]:
        self._check_revision(repo, revision)
        row = summary(repo)
        row.update(details(repo))
        row["cardData"] = card(repo)
        blobs = flag(query, "blobs")
        row["siblings"] = [sibling(f, blobs) for f in sorted(repo.files.values(), key=_path)]
        row["usedStorage"] = sum(len(f.data) for f in repo.files.values())
        return expanded(row, repo, query)

    def _tree(self, repo: HubRepo, folder: str, query: dict[str, list[str]]) -> list[Any]:
        prefix = f"{folder}/" if folder else ""
        recursive = flag(query, "recursive")
        entries: dict[str, dict[str, Any]] = {}
        for hub_file in sorted(repo.files.values(), key=_path):
            if not hub_file.path.startswith(prefix):
                continue
            below = hub_file.path[len(prefix) :].split("/")
            for depth in range(1, len(below)):
                directory = prefix + "/".join(below[:depth])
                if depth == 1 or recursive:
                    entries.setdefault(directory, directory_entry(directory))
            if len(below) == 1 or recursive:
                entries[hub_file.path] = file_entry(hub_file)
        if folder and not entries:
            raise _Reply(404, "EntryNotFound", f"{folder} does not exist on main")
        return list(entries.values())

    # -- /resolve and the CDN -------------------------------------------------------------------

    def _resolve(self, path: str, head: bool) -> int:
        before, _, file_path = path.partition("/resolve/")
        revision, _, file_path = file_path.partition("/")
        repo = self._repo_or_reply(before.strip("/"))
        self._check_revision(repo, revision)
        self._check_access(repo)
        hub_file = repo.files.get(file_path)
        if hub_file is None:
            raise _Reply(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": repo.commit})
        headers = {
            "X-Repo-Commit": repo.commit,
            "ETag": f'"{hub_file.git_oid}"',
            "Accept-Ranges": "bytes",
        }
        if hub_file.lfs:
            headers["X-Linked-Etag"] = f'"{hub_file.sha256}"'
            headers["X-Linked-Size"] = str(len(hub_file.data))
            if self.hub.cdn_redirect:
                location = (
                    f"{self.hub.cdn_url}/cdn/{quote(repo.repo_id)}/{hub_file.sha256}"
                    f"?file={quote(file_path)}"
                )
                headers["Location"] = location
                return self._send_bytes(302, b"", headers, head)
            headers["ETag"] = f'"{hub_file.sha256}"'
        return self._send_content(repo, hub_file, headers, head)

    def _cdn(self, path: str, head: bool) -> int:
        # /cdn/{ns}/{name}/{sha256}: a signed CDN URL needs no token.
        parts = path.strip("/").split("/")
        repo = self.hub._repo(f"{parts[1]}/{parts[2]}") if len(parts) == 4 else None
        matches = [f for f in repo.files.values() if f.sha256 == parts[3]] if repo else []
        if repo is None or not matches:
            raise _Reply(404, None, "NoSuchKey")
        headers = {"ETag": f'"{matches[0].sha256}"', "Accept-Ranges": "bytes"}
        return self._send_content(repo, matches[0], headers, head)

    def _send_content(
        self, repo: HubRepo, hub_file: HubFile, headers: dict[str, str], head: bool
    ) -> int:
        total = len(hub_file.data)
        faults = self.hub._take_faults(repo.repo_id, hub_file.path) if not head else Faults()
        if faults.status is not None:
            raise _Reply(faults.status, None, f"Injected status {faults.status}")
        start, end = 0, total - 1
        status = 200
        range_header = self.headers.get("Range")
        if range_header is not None:
            match = _RANGE.match(range_header.strip())
            if match is None or (not match.group(1) and not match.group(2)):
                raise _Reply(400, None, f"Bad Range header: {range_header}")
            if match.group(1):
                start = int(match.group(1))
                end = min(int(match.group(2)), total - 1) if match.group(2) else total - 1
            else:
                start = max(total - int(match.group(2)), 0)
            if start >= total or start > end:
                raise _Reply(
                    416,
                    None,
                    "Requested Range Not Satisfiable",
                    {"Content-Range": f"bytes */{total}"},
                )
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{total}"
        headers["Content-Type"] = "application/octet-stream"
        headers["Content-Length"] = str(end - start + 1)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if not head:
            self._stream(repo, hub_file, start, end + 1, faults)
        return status

    def _stream(
        self, repo: HubRepo, hub_file: HubFile, start: int, stop: int, faults: Faults
    ) -> None:
        """Send data[start:stop] in blocks, acting out the faults at their offsets."""
        view = memoryview(hub_file.data)
        offset = start
        began = time.monotonic()
        try:
            while offset < stop:
                block_end = min(stop, offset + _SEND_BLOCK)
                for limit in (faults.drop_after_bytes, faults.stall_after_bytes):
                    if limit is not None and offset < limit < block_end:
                        block_end = limit
                if offset == faults.drop_after_bytes:
                    self._cut()
                    return
                if offset == faults.stall_after_bytes:
                    faults.stall_after_bytes = None
                    if self.hub._stopping.wait(faults.stall_s):
                        self._cut()
                        return
                block = bytes(view[offset:block_end]) if faults.corrupt_at is not None else None
                if block is not None and offset <= faults.corrupt_at < block_end:  # type: ignore[operator]
                    flipped = bytearray(block)
                    flipped[faults.corrupt_at - offset] ^= 0xFF  # type: ignore[operator]
                    block = bytes(flipped)
                self.wfile.write(block if block is not None else view[offset:block_end])
                self.hub._count(repo.repo_id, hub_file.path, block_end - offset)
                offset = block_end
                if faults.rate_bytes_per_s:
                    ahead = (offset - start) / faults.rate_bytes_per_s - (time.monotonic() - began)
                    if ahead > 0 and self.hub._stopping.wait(ahead):
                        self._cut()
                        return
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _cut(self) -> None:
        """Drop the connection as a failing network would: no more bytes, then a reset."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # -- sending --------------------------------------------------------------------------------

    def _send_error(self, reply: _Reply) -> None:
        headers = {"X-Error-Message": reply.message, **reply.headers}
        if reply.code is not None:
            headers["X-Error-Code"] = reply.code
        body = json.dumps({"error": reply.message}).encode()
        self._send_bytes(reply.status, body, headers, self.command == "HEAD")

    def _send_json(self, payload: Any) -> int:
        body = json.dumps(payload).encode()
        return self._send_bytes(200, body, {"Content-Type": "application/json"}, False)

    def _send_bytes(self, status: int, body: bytes, headers: dict[str, str], head: bool) -> int:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)
        return status


def point_huggingface_hub_at(hub: FakeHub, hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make this process's `huggingface_hub` (and code reading its constants) use `hub`, with
    its cache under `hf_home` and no token: it read the environment once, at import."""
    from huggingface_hub import constants

    for name, value in hub.env(hf_home).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(
        constants,
        "HUGGINGFACE_CO_URL_TEMPLATE",
        hub.url + "/{repo_id}/resolve/{revision}/{filename}",
    )
    monkeypatch.setattr(constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(hf_home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(hf_home / "stored_tokens"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
