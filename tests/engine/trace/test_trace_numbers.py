"""Numbers in a trace file are finite and in range, or the file is refused naming the line and
the field (issue 43: a NaN arrival kept a what-if waiting forever, an infinite step duration was
a numpy traceback, -1e308 printed as a 300-digit figure)."""

from __future__ import annotations

import pytest
from whatif_recordings import record_session, with_field

from kvscope.engine.trace import read_trace


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return record_session(tmp_path_factory.mktemp("numbers"))


@pytest.mark.parametrize(
    "kind, field, raw",
    [
        ("trace_request", "time", "NaN"),
        ("trace_request", "time", "-1e308"),
        ("trace_finish", "time", "Infinity"),
        ("trace_step", "duration", "Infinity"),
        ("trace_step", "duration", "NaN"),
        ("trace_step", "duration", "-1e308"),
        ("trace_step", "duration", "1e9"),
        ("trace_step", "time", "1e300"),
    ],
)
def test_a_number_out_of_range_names_its_line_and_field(session, tmp_path, kind, field, raw):
    bad, line = with_field(session, tmp_path / "bad.jsonl", kind, field, raw)
    with pytest.raises(ValueError) as caught:
        read_trace(bad)
    message = str(caught.value)
    assert message.startswith(f"{bad}:{line}: {kind}.{field} is ")
    assert "it must be a number of seconds in [0, " in message


def test_the_recorded_numbers_pass(session):
    trace = read_trace(session)
    assert trace.steps and all(s.duration >= 0 for s in trace.steps)
