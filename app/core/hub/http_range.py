"""Fetch the rest of one file over HTTP with `Range`, through drops, stalls and server hiccups.

One GET streams `bytes=done-` into a BlobSink; when the connection drops or no byte comes for
`stall_timeout_s`, the next GET asks for the bytes still missing, after a backoff that doubles
(capped) and resets whenever bytes arrived. The body is read by `http_get` (the standard
library, a megabyte a read, the proxy environment honoured, the token dropped when a redirect
leaves the hub's host); the caller builds the headers with huggingface_hub's `build_hf_headers`
(token, user agent), and an error status is worded by huggingface_hub's `hf_raise_for_status`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import httpx2
from huggingface_hub.utils import hf_raise_for_status

from kvscope.app.core.hub.blob_sink import BlobSink
from kvscope.app.core.hub.errors import PullCancelled, PullError
from kvscope.app.core.hub.http_get import HttpBody, HttpTransportError, open_get
from kvscope.app.core.hub.pull_control import PullControl

_REPORT_EVERY = 1 << 20  # bytes between two progress calls: each costs a little
_RETRY_STATUSES = (408, 429, 500, 502, 503, 504)
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


@dataclass(frozen=True)
class RetryPolicy:
    """How long a silent connection may stay open and how retries back off."""

    stall_timeout_s: float = 30.0
    retry_base_s: float = 1.0
    retry_cap_s: float = 30.0
    max_failures: int = 6  # in a row without a byte arriving in between
    connect_timeout_s: float = 15.0


class _Retry(Exception):
    """A failure worth another try after a backoff; `received` is where the file stands now."""

    def __init__(self, why: str, received: int) -> None:
        super().__init__(why)
        self.received = received


class _RangeRefused(Exception):
    """416: the server has no bytes from where we would resume."""


def fetch_rest(
    url: str,
    headers: dict[str, str],
    sink: BlobSink,
    done: int,
    size: int,
    control: PullControl,
    on_bytes: Callable[[int], None],
    on_wait: Callable[[str], None],
    policy: RetryPolicy,
) -> None:
    """Fill `sink` from byte `done` to `size`. `on_bytes(done)` after each batch; `on_wait(why)`
    before a backoff or while paused. Raises PullError in words, PullCancelled on cancel."""
    failures = 0
    refused_ranges = 0
    while done < size:
        if control.cancelled:
            raise PullCancelled("cancelled")
        if control.paused:
            on_wait("paused")
            control.wait_while_paused()
            on_bytes(done)  # resumed: downloading again
            continue
        before = done
        try:
            done = _stream_once(url, headers, sink, done, size, control, on_bytes, policy)
        except _RangeRefused:
            refused_ranges += 1
            if refused_ranges > 1:
                raise PullError(
                    f"the server refused the byte range (HTTP 416) for {url}, even from byte 0."
                ) from None
            # The bytes we hold are not a prefix of this file any more: start it over.
            sink.restart()
            done = 0
            on_bytes(0)
        except _Retry as error:
            done = error.received
            if control.cancelled or control.paused:
                continue  # our own interrupt, not a failure
            failures = 1 if done > before else failures + 1
            if failures > policy.max_failures:
                raise PullError(
                    f"the download kept failing ({error}), {policy.max_failures} tries in a row."
                    f" {done:,} of {size:,} bytes are kept: run the same pull again to resume."
                ) from error
            delay = min(policy.retry_cap_s, policy.retry_base_s * 2 ** (failures - 1))
            on_wait(f"{error}; retrying in {delay:g} s")
            control.sleep(delay)


def _stream_once(
    url: str,
    headers: dict[str, str],
    sink: BlobSink,
    done: int,
    size: int,
    control: PullControl,
    on_bytes: Callable[[int], None],
    policy: RetryPolicy,
) -> int:
    """One GET of the missing bytes; returns the new `done`. Each buffer is handed to the
    sink's writer before the next is read; the sink is drained before this returns or raises,
    so the partial file holds every byte counted in `done` (a kill loses at most the buffers in
    flight). The _Retry raised says where the file stands."""
    request_headers = {**headers, "Range": f"bytes={done}-", "Accept-Encoding": "identity"}
    reported = done
    body: HttpBody | None = None
    try:
        body = open_get(url, request_headers, policy.connect_timeout_s, policy.stall_timeout_s)
        done = reported = _check_answer(body, sink, done, size, on_bytes)
        control.attach(body.socket)
        while done < size:
            buffer = sink.buffer()
            try:
                count = body.readinto(buffer[: min(len(buffer), size - done)])
            except BaseException:
                sink.release(buffer)  # a stall, a drop: the buffer goes back for the next GET
                raise
            if count == 0:
                sink.release(buffer)  # a drop, or our pause shutting the socket
                break
            sink.submit(buffer, count)
            done += count
            if done - reported >= _REPORT_EVERY:
                on_bytes(done)
                reported = done
        if done == size and body.readinto(memoryview(bytearray(1))) > 0:
            raise PullError(f"the server sent more than the file's {size:,} bytes.")
    except HttpTransportError as error:
        raise _Retry(_describe(error, policy), done) from error
    finally:
        control.attach(None)
        if body is not None:
            body.close()
        sink.drain()
        if done != reported:
            on_bytes(done)
    if done < size:
        # http.client ends a body cut short without an error: a drop, or a shut socket.
        raise _Retry(f"the connection dropped at byte {done:,} of {size:,}", done)
    return done


def _check_answer(
    body: HttpBody,
    sink: BlobSink,
    done: int,
    size: int,
    on_bytes: Callable[[int], None],
) -> int:
    """Errors for a status that brings no bytes; returns where the body starts in the file."""
    if body.status == 416:
        raise _RangeRefused()
    if body.status in _RETRY_STATUSES:
        raise _Retry(f"the server answered HTTP {body.status}", done)
    if body.status >= 400:
        _raise_hub_error(body)
    if body.status == 206:
        _check_content_range(body.headers.get("Content-Range"), done, size)
        return done
    if done > 0:
        sink.restart()  # the server ignored the Range and sends the whole file
        on_bytes(0)
    return 0


def _raise_hub_error(body: HttpBody) -> None:
    """huggingface_hub's own error for the answer (gated, not found, ...), so a pull words it
    as search and listing do."""
    response = httpx2.Response(
        body.status,
        headers=list(body.headers.items()),
        content=body.read_all(),
        request=httpx2.Request("GET", body.url),
    )
    hf_raise_for_status(response)
    raise PullError(f"the server answered HTTP {body.status} for {body.url}")


def _check_content_range(header: str | None, done: int, size: int) -> None:
    match = _CONTENT_RANGE.fullmatch((header or "").strip())
    if match is None or int(match.group(1)) != done:
        raise _Retry(f"the server answered the range from byte {done:,} with {header!r}", done)
    if match.group(3) != "*" and int(match.group(3)) != size:
        raise PullError(
            f"the file on the server is {int(match.group(3)):,} bytes, the hub lists {size:,}:"
            " it changed while downloading; run the pull again."
        )


def _describe(error: HttpTransportError, policy: RetryPolicy) -> str:
    if error.kind == "stall":
        return f"no bytes for {policy.stall_timeout_s:g} s"
    if error.kind == "connect":
        return f"cannot connect ({error})"
    return "the connection dropped"
