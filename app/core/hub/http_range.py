"""Fetch the rest of one file over HTTP with `Range`, through drops, stalls and server hiccups.

One GET streams `bytes=done-` into a BlobSink; when the connection drops or no byte comes for
`stall_timeout_s`, the next GET asks for the bytes still missing, after a backoff that doubles
(capped) and resets whenever bytes arrived. Requests go through huggingface_hub's shared HTTP
client (its proxy settings, offline switch and request ids); the caller builds the headers with
huggingface_hub's `build_hf_headers` (token, user agent). A redirect to the CDN is followed by the
client, which drops the token on the way off the hub's host.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import httpx2
from huggingface_hub.utils import get_session, hf_raise_for_status

from kvscope.app.core.hub.blob_sink import BlobSink
from kvscope.app.core.hub.errors import PullCancelled, PullError
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
    """One GET of the missing bytes; returns the new `done`. Each chunk is in the partial file
    before the next is read, so a break (or a kill) loses at most the chunk in flight; the
    _Retry raised says where the file stands."""
    timeout = httpx2.Timeout(
        policy.stall_timeout_s, connect=policy.connect_timeout_s, pool=policy.connect_timeout_s
    )
    request_headers = {**headers, "Range": f"bytes={done}-", "Accept-Encoding": "identity"}
    reported = done
    try:
        with get_session().stream(
            "GET", url, headers=request_headers, timeout=timeout, follow_redirects=True
        ) as response:
            done = reported = _check_answer(response, sink, done, size, on_bytes)
            stream = response.extensions.get("network_stream")
            control.attach(stream.get_extra_info("socket") if stream is not None else None)
            for chunk in response.iter_raw():
                if done + len(chunk) > size:
                    raise PullError(f"the server sent more than the file's {size:,} bytes.")
                sink.write(chunk)
                done += len(chunk)
                if done - reported >= _REPORT_EVERY:
                    on_bytes(done)
                    reported = done
    except httpx2.TransportError as error:
        raise _Retry(_describe(error, policy), done) from error
    finally:
        control.attach(None)
        if done != reported:
            on_bytes(done)
    if done < size:
        raise _Retry(f"the server ended the response at byte {done:,} of {size:,}", done)
    return done


def _check_answer(
    response: httpx2.Response,
    sink: BlobSink,
    done: int,
    size: int,
    on_bytes: Callable[[int], None],
) -> int:
    """Errors for a status that brings no bytes; returns where the body starts in the file."""
    if response.status_code == 416:
        raise _RangeRefused()
    if response.status_code in _RETRY_STATUSES:
        raise _Retry(f"the server answered HTTP {response.status_code}", done)
    if response.status_code >= 400:
        response.read()
        hf_raise_for_status(response)
    if response.status_code == 206:
        _check_content_range(response.headers.get("Content-Range"), done, size)
        return done
    if done > 0:
        sink.restart()  # the server ignored the Range and sends the whole file
        on_bytes(0)
    return 0


def _check_content_range(header: str | None, done: int, size: int) -> None:
    match = _CONTENT_RANGE.fullmatch((header or "").strip())
    if match is None or int(match.group(1)) != done:
        raise _Retry(f"the server answered the range from byte {done:,} with {header!r}", done)
    if match.group(3) != "*" and int(match.group(3)) != size:
        raise PullError(
            f"the file on the server is {int(match.group(3)):,} bytes, the hub lists {size:,}:"
            " it changed while downloading; run the pull again."
        )


def _describe(error: httpx2.TransportError, policy: RetryPolicy) -> str:
    if isinstance(error, httpx2.ReadTimeout):
        return f"no bytes for {policy.stall_timeout_s:g} s"
    if isinstance(error, httpx2.ConnectError):
        return f"cannot connect ({error})"
    if isinstance(error, httpx2.TimeoutException):
        return "the connection timed out"
    if isinstance(error, (httpx2.RemoteProtocolError, httpx2.ReadError)):
        return "the connection dropped"
    return f"the connection failed ({error or type(error).__name__})"
