"""Read the traffic trace out of a session file (format version 4), as untrusted data.

The header's "trace" entry holds the settings the session ran under; the `trace_*` lines hold
the records (`engine.trace.records`), checked field by field by the KV events' reader. A file
recorded before version 4 has no trace: that is a ValueError saying so, not an empty replay.
Counts are bounded before anything grows with them, so a crafted file cannot take the memory.
Every number is finite and in a range a real session has: a NaN arrival once kept a what-if
waiting for a time that never came, and a step of -1e308 seconds printed as a 300-digit span.
"""

from __future__ import annotations

import math
from pathlib import Path

from kvscope.engine.kv.events import (
    KVEvent,
    event_from_json,
    is_trace_line,
    read_numbered_events,
)
from kvscope.engine.kv.session_json import load_json, numbered_lines, shown
from kvscope.engine.trace.log import Trace
from kvscope.engine.trace.records import (
    TRACE_TYPES,
    TracedFinish,
    TracedRequest,
    TracedStep,
    TraceSettings,
)

MAX_REQUESTS = 200_000
MAX_STEPS = 2_000_000
MAX_TOKENS = 100_000_000  # prompt and output token ids over the whole trace (~800 MB as ints)
# Wall-clock seconds since 1970: up to the year ~5000, far past any recording and far below
# where a span of them, sped up or slowed down by a what-if's rate_scale, loses its digits.
MAX_TIME_S = 1e11
MAX_STEP_S = 86_400.0  # one engine step of a day: anything longer is a damaged file


def read_trace(path: str | Path) -> Trace:
    path = Path(path)
    header, _ = read_numbered_events(path)  # checks the file and its version
    if "trace" not in header:
        raise ValueError(
            f"{path}: this recording has no traffic trace (format version "
            f"{shown(header.get('kvscope_events'))}; traces came with version 4): record it again "
            "with `kvscope record` or the app's Record button"
        )
    try:
        settings = TraceSettings.from_json(header["trace"])
    except ValueError as e:
        raise ValueError(f"{path}:1: {e}") from None
    start_step = header.get("trace_start_step", 0)
    if not isinstance(start_step, int) or isinstance(start_step, bool) or start_step < 0:
        raise ValueError(f"{path}:1: header trace_start_step must be an int >= 0")
    requests: dict[str, TracedRequest] = {}
    finishes: dict[str, TracedFinish] = {}
    steps: list[TracedStep] = []
    tokens = 0
    for number, line in numbered_lines(path):
        try:
            raw = load_json(line)
            if not is_trace_line(raw):
                continue
            record = event_from_json(raw, TRACE_TYPES)
            _check_numbers(record)
            tokens += _check(record, requests, finishes, steps)
        except ValueError as e:
            raise ValueError(f"{path}:{number}: {e}") from None
        if tokens > MAX_TOKENS:
            raise ValueError(f"{path}:{number}: the trace holds over {MAX_TOKENS:,} token ids")
        if isinstance(record, TracedRequest):
            requests[record.request_id] = record
        elif isinstance(record, TracedFinish):
            finishes[record.request_id] = record
        else:
            assert isinstance(record, TracedStep)  # the third of TRACE_TYPES
            steps.append(record)
    notes: tuple[str, ...] = ()
    cached = header.get("cached_blocks", [])
    if isinstance(cached, list) and cached:
        # Their prefixes are hashes here, not tokens: a replay cannot hit them as the run did.
        notes = (
            f"the pool held {len(cached):,} cached blocks when recording began; a replay "
            "starts without them",
        )
    return Trace(
        settings, tuple(requests.values()), finishes, tuple(steps), start_step, notes=notes
    )


def _check_numbers(record: KVEvent) -> None:
    """A record's seconds are finite and in range (NaN compares false with everything, so a
    range check alone lets it through)."""
    _in_range(f"{record.kind}.time", record.time, 0.0, MAX_TIME_S)
    if isinstance(record, TracedStep):
        _in_range(f"{record.kind}.duration", record.duration, 0.0, MAX_STEP_S)


def _in_range(where: str, value: float, low: float, high: float) -> None:
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(
            f"{where} is {value!r}; it must be a number of seconds in [{low:g}, {high:g}]"
        )


def _check(
    record: KVEvent,
    requests: dict[str, TracedRequest],
    finishes: dict[str, TracedFinish],
    steps: list[TracedStep],
) -> int:
    """Check one record against those before it; returns the token ids it adds."""
    if isinstance(record, TracedRequest):
        if record.request_id in requests:
            raise ValueError(f"request {shown(record.request_id)} arrives twice")
        if len(requests) >= MAX_REQUESTS:
            raise ValueError(f"the trace holds over {MAX_REQUESTS:,} requests")
        if not record.prompt_token_ids or not 1 <= record.n <= 1024:
            raise ValueError("a traced request has a prompt and 1 to 1,024 samples")
        return len(record.prompt_token_ids)
    if isinstance(record, TracedFinish):
        arrived = requests.get(record.request_id)
        if arrived is None or record.request_id in finishes:
            raise ValueError(f"request {shown(record.request_id)} ends without having arrived")
        if len(record.outputs) != arrived.n or len(record.reasons) != arrived.n:
            raise ValueError(
                f"request {shown(record.request_id)} ends with {len(record.outputs)} samples, "
                f"it asked for {arrived.n}"
            )
        if any(len(out) > arrived.max_tokens for out in record.outputs):
            raise ValueError(f"request {shown(record.request_id)} produced over its max_tokens")
        return sum(len(out) for out in record.outputs)
    if len(steps) >= MAX_STEPS:
        raise ValueError(f"the trace holds over {MAX_STEPS:,} steps")
    if steps and record.step <= steps[-1].step:
        raise ValueError(f"step {record.step} comes after step {steps[-1].step}")
    return 0
