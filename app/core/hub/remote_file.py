"""One file on the hub, read in byte ranges: the engine's GGUF header reader runs over it.

Every read is an HTTP `Range` request through huggingface_hub's own session, URL and headers
(`hf_hub_url`, `build_hf_headers`), so HF_ENDPOINT, HF_TOKEN and the session's proxy settings
apply, and the token is dropped when the hub redirects to its CDN. A server that ignores Range
and answers 200 is read only as far as the bytes wanted, then the response is closed: a header
read never downloads a model. `fetched_bytes` and `requests` count what the reads cost.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from huggingface_hub import hf_hub_url
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from kvscope.app.core.hub.search_errors import HubSearchError, check_online, hub_search_error

READ_TIMEOUT_S = 20.0  # per request: connect, and each wait for bytes
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_PROBE_BYTES = 64 << 10  # what learning an unknown size reads (kept: a header starts there)


class RemoteFile:
    """`repo`'s file `path` at `revision`, as `len()` and byte slices (engine GGUFBytes); one
    thread reads it at a time (the search reads several files at once, each its own)."""

    def __init__(
        self,
        repo: str,
        path: str,
        size: int | None = None,
        revision: str | None = None,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.repo, self.path, self.timeout_s = repo, path, timeout_s
        self.url = hf_hub_url(repo, path, revision=revision)
        self._size = size
        self._first = b""  # the probe's bytes, when the size had to be learned
        self.fetched_bytes = 0
        self.requests = 0

    def __len__(self) -> int:
        if self._size is None:
            self._first = self._fetch(0, _PROBE_BYTES)
        if self._size is None:
            raise HubSearchError(f"{self.repo}/{self.path}: the hub did not say how large it is")
        return self._size

    def __getitem__(self, key: slice) -> bytes:
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise ValueError("a remote file reads contiguous byte ranges only")
        if stop <= start:
            return b""
        if start < len(self._first):  # the probe's bytes are not asked for twice
            kept = self._first[start:stop]
            return kept + self._fetch(start + len(kept), stop) if start + len(kept) < stop else kept
        return self._fetch(start, stop)

    def _fetch(self, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of the file (fewer only at its end)."""
        check_online()
        headers = build_hf_headers(
            headers={"Range": f"bytes={start}-{stop - 1}", "Accept-Encoding": "identity"}
        )
        try:
            with get_session().stream(
                "GET", self.url, headers=headers, timeout=self.timeout_s, follow_redirects=True
            ) as response:
                if response.status_code >= 400:
                    response.read()  # the error's message is in the body
                hf_raise_for_status(response)
                skip = self._check_answer(response.status_code, response.headers, start)
                data = bytearray()
                for chunk in response.iter_bytes():
                    data += chunk
                    if len(data) >= skip + stop - start:
                        break  # enough: leaving the block closes the response
        except HubSearchError:
            raise
        except Exception as e:  # huggingface_hub's and the transport's errors, said in words
            raise hub_search_error(e, self.repo, self.path) from e
        self.fetched_bytes += len(data)
        self.requests += 1
        return bytes(data[skip : skip + stop - start])

    def _check_answer(self, status: int, headers: Mapping[str, str], start: int) -> int:
        """Bytes to skip before `start`'s: 0 for a 206 of the range asked, `start` for a whole
        file (200). Learns the file's size from either."""
        if status == 206:
            content_range = headers.get("Content-Range", "")
            match = _CONTENT_RANGE.fullmatch(content_range)
            if match is None or int(match.group(1)) != start:
                raise HubSearchError(
                    f"{self.repo}/{self.path}: the hub answered bytes {content_range!r} to a "
                    f"request for bytes from {start}"
                )
            if self._size is None and match.group(3) != "*":
                self._size = int(match.group(3))
            return 0
        if status == 200:
            length = headers.get("Content-Length")
            if self._size is None and length:
                self._size = int(length)
            return start
        raise HubSearchError(f"{self.repo}/{self.path}: unexpected answer {status} to a range read")
