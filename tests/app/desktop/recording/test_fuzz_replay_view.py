"""The Replay window's first look at a recording (`check_recording`: the header, before the
replay's reader runs on a thread) under the fuzz harness (tests/fuzz_readers.py): a result or
the OSError or ValueError that Open Recording shows in its message box."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fuzz_readers import Reader, check_refused_path, fuzz

from kvscope.app.desktop.recording.replay_view import check_recording

VIEW = Reader("recording", check_recording, (OSError, ValueError), ".jsonl")


def test_mutated_recordings_pass_the_first_look_or_are_refused(tmp_path):
    fuzz(VIEW, tmp_path, examples=60)


@pytest.mark.parametrize("name", ["nul", "zero", "fifo", "folder", "dangling"])
def test_a_path_that_is_no_recording_is_refused_before_it_is_read(tmp_path, name):
    check_refused_path(
        replace(VIEW, errors=(ValueError,)),
        tmp_path,
        name,
        {
            "nul": "the viewer opens recordings up to 256 MiB",
            "dangling": "recording does not exist",
        },
    )
