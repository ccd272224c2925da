"""The session file's readers under the fuzz harness (tests/fuzz_readers.py): the KV replay
(`kvscope replay`, the app's Replay window) and the traffic trace (`kvscope whatif`, the
What-if tab) read every mutated recording to the end, or refuse it with the ValueError their
callers show, naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzz_readers import (
    Reader,
    check_corpus,
    check_refused_path,
    fuzz,
    hostile_paths,
)

from kvscope.engine.kv.replay import replay_events
from kvscope.engine.trace import read_trace


def read_recording(path: Path) -> None:
    """Both readers, each to the end; the first one's error."""
    errors = []
    for read in (lambda p: sum(1 for _ in replay_events(p, with_shadow=True)), read_trace):
        try:
            read(path)
        except ValueError as e:
            assert str(path) in str(e), e
            errors.append(e)
    if errors:
        raise errors[0]


RECORDING = Reader("recording", read_recording, (ValueError,), ".jsonl")


def test_the_corpus_reads_or_is_refused_within_bounds(tmp_path):
    peaks = check_corpus(RECORDING, tmp_path)
    assert len(peaks) >= 18


def test_mutated_recordings_read_or_are_refused(tmp_path):
    fuzz(RECORDING, tmp_path, examples=400)


@pytest.mark.parametrize("name", ["nul", "zero", "fifo", "folder", "dangling", "empty"])
def test_a_path_that_is_no_recording_is_refused_before_it_is_read(tmp_path, name):
    check_refused_path(
        RECORDING,
        tmp_path,
        name,
        {
            "nul": "not a KVScope event file",  # its first 4 KiB read, not 785 MB
            "dangling": "does not exist",
            "empty": "is empty",
        },
    )


@pytest.mark.parametrize("command", ["replay", "whatif"])
def test_the_commands_print_the_refusal_and_exit_2(tmp_path, capsys, command):
    from kvscope.app.cli.main import main

    paths = hostile_paths(tmp_path, ".jsonl")
    names = [n for n in ("nul", "zero", "fifo", "folder", "dangling") if n in paths]
    for name in names:
        assert main([command, str(paths[name])]) == 2, name
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error: ") == len(names), err
