"""What one replica's status line says: its state in a word, then the KV event stream's and
the /metrics poller's details, as plain text and a severity the card colours it by.

States, most serious first: "down" (metrics unreachable and no live event stream),
"reconnecting in N s" (the event socket lost its server; ZMQ retries with backoff),
"silent for N s" (connected, nothing for a while, yet /metrics says requests run: events are
not arriving), "idle for N s" (connected, nothing for a while, nothing running: the usual
quiet server; ZMQ heartbeats would have shown a dead link as reconnecting), "live".

An HTTP error is said in words ("nothing is listening at http://127.0.0.1:8000: is the server
running?"); the exception's own text ("ConnectError: [Errno 111] Connection refused") stays in
`technical`, which the card puts in its tooltip."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

OK, WARN, BAD, IDLE = "ok", "warn", "bad", "idle"
SEVERITY_HEX = {OK: "#2BB673", WARN: "#F3C300", BAD: "#E8354F", IDLE: "#8C94A3"}


@dataclass(frozen=True)
class StatusLine:
    state: str  # "live", "silent for 12 s", "down", "reconnecting", "connecting", "stopped"
    severity: str  # OK | WARN | BAD | IDLE
    details: tuple[str, ...]  # "events seq 812", "1 restart (cache cleared)", ...
    technical: tuple[str, ...] = ()  # the errors as raised, for the tooltip

    @property
    def text(self) -> str:
        return " · ".join((self.state, *self.details))


def count_text(n: int) -> str:
    """A count in bounded text: exact up to 9,999,999, then "2.7e20", and "over 1e30" past
    that (a peer's seqs are its word: the missed count once read 267,477,789,068,788,498,399,
    and an int past 1e308 does not even convert to a float)."""
    if n < 10_000_000:
        return f"{n:,}"
    if n.bit_length() > 100:
        return "over 1e30"
    mantissa, exponent = f"{n:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


# (pattern in the raised text, what it means; {url} is the replica's base URL)
_PLAIN_ERRORS = (
    (r"Errno 111|Connection refused|ECONNREFUSED|WinError 10061",
     "nothing is listening at {url}: is the server running?"),
    (r"Name or service not known|nodename nor servname|getaddrinfo failed|Errno -[23]",
     "cannot find the host of {url}: is the address right?"),
    (r"Errno 113|Errno 101|No route to host|Network is unreachable",
     "cannot reach {url} from this machine: is the address right?"),
    (r"Timeout|timed out", "{url} did not answer in time: is it busy or behind a firewall?"),
    (r"HTTP 40[13]\b", "{url} refused the API key: check the key in Engine ▸ Connect…"),
    (r"HTTP 404\b", "{url} has no /metrics: is it a vLLM-compatible server?"),
    (r"HTTP 5\d\d\b", "{url} answered with a server error: see its log"),
    (r"RemoteProtocolError|Server disconnected|Connection reset|Errno 104",
     "{url} closed the connection: is it an HTTP server?"),
)  # fmt: skip


def plain_http_error(error: str, url: str) -> str:
    """An HTTP error as a user would say it; the raw text when it is none of the known kinds."""
    for pattern, words in _PLAIN_ERRORS:
        if re.search(pattern, error, flags=re.IGNORECASE):
            return words.format(url=url)
    return error


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{count_text(n)} {one if n == 1 else many or one + 's'}"


def _events_state(status, now: float, metrics=None) -> tuple[str, str]:
    if status is None:
        return "connecting", IDLE
    if status.state == "live":
        return "live", OK
    if status.state == "silent":
        # Quiet since the last frame, or since connecting if that came later (a reconnect).
        heard = max(status.last_frame_at or 0.0, status.connected_at or 0.0) or status.since
        quiet = max(0.0, now - heard)
        if metrics is not None and (metrics.running or metrics.waiting):
            return f"silent for {quiet:.0f} s", WARN  # requests run, yet no events come
        return f"idle for {quiet:.0f} s", IDLE
    if status.state == "connecting":
        retry_at = status.retry_at
        if not (status.error or status.last_seq is not None or retry_at):
            return "connecting", IDLE
        if retry_at is not None and retry_at > now:
            return f"reconnecting in {math.ceil(retry_at - now)} s", WARN
        return "reconnecting", WARN
    return status.state, IDLE


def status_line(snapshot, now: float) -> StatusLine:
    """`snapshot` is a ReplicaSnapshot (app/remote/monitor.py); `now` is time.time(), the
    clock of the subscriber status's `since` / `retry_at` / `last_frame_at`."""
    status = snapshot.status
    has_events = snapshot.connection.kv_events is not None
    http_down = snapshot.http_state == "down"
    details: list[str] = []
    if has_events:
        state, severity = _events_state(status, now, snapshot.metrics)
    else:
        state, severity = ("live", OK) if snapshot.http_state == "up" else ("connecting", IDLE)
        details.append("no KV events endpoint: metrics only")
    if http_down and state != "live":
        state, severity = "down", BAD
    technical: list[str] = []
    if http_down:
        raw = snapshot.http_error or "no answer"
        error = plain_http_error(raw, snapshot.connection.url)
        if error == raw:
            error = f"HTTP error: {raw}"
        else:
            technical.append(f"HTTP error: {raw}")
        retry_at = snapshot.http_retry_at
        if retry_at is not None and retry_at > now:
            error += f" (retry in {retry_at - now:.0f} s)"
        details.append(error)
    elif snapshot.http_state == "connecting":
        details.append("metrics: connecting")
    if has_events and status is not None:
        if status.error and status.state != "live":
            details.append(f"events: {status.error}")
        if status.last_seq is not None:
            details.append(f"seq {count_text(status.last_seq)}")
        # The subscriber's count, not the cache's clears: a publisher's first batch is an
        # AllBlocksCleared ("the pool as it stands"), which is no restart.
        if status.restarts:
            details.append(_plural(status.restarts, "restart") + " (cache cleared)")
        if status.malformed:
            why = status.malformed_error
            details.append(
                _plural(status.malformed, "malformed frame") + (f" ({why})" if why else "")
            )
        if status.missed or status.recovered:
            details.append(
                f"replayed {count_text(status.recovered)} · lost {count_text(status.missed)} seqs"
            )
        if status.missed and severity == OK:
            severity = WARN  # the map may lack blocks it was never told about
    cache = snapshot.cache
    if cache.not_kept:
        details.append(
            f"{count_text(cache.not_kept)} blocks not kept: over the cap of {cache.max_blocks:,}"
        )
        if severity == OK:
            severity = WARN  # the map shows fewer blocks than the server announced
    return StatusLine(state, severity, tuple(details), tuple(technical))
