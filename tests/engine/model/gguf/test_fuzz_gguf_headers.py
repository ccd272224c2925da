"""GGUF headers under the fuzz harness (tests/fuzz_readers.py): what the settings dialog's
model picker, `kvscope plan` and the loader read before any tensor data (the config, the
weights' shapes and kinds, the tensor types) ends in a result or the ValueError they show."""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzz_readers import Reader, check_bounded, check_corpus, fuzz, hostile_paths

from kvscope.engine.model.gguf.loader import check_tensor_types
from kvscope.engine.model.gguf.split import read_gguf_model
from kvscope.engine.sizing import planner


def read_header(path: Path) -> None:
    planner.model_config(path)
    planner.weights_header(path)
    check_tensor_types(read_gguf_model(path))  # what the loader refuses before reading data


GGUF = Reader("gguf", read_header, (ValueError,), ".gguf")


def test_the_corpus_reads_or_is_refused_within_bounds(tmp_path):
    peaks = check_corpus(GGUF, tmp_path)
    assert len(peaks) >= 12


def test_mutated_headers_read_or_are_refused(tmp_path):
    fuzz(GGUF, tmp_path, examples=400)


@pytest.mark.parametrize("name", ["nul", "zero", "fifo", "dangling", "empty"])
def test_a_path_that_is_no_model_file_is_refused_before_it_is_read(tmp_path, name):
    paths = hostile_paths(tmp_path, ".gguf")
    if name not in paths:
        pytest.skip(f"no {name} on this system")
    error, peak = check_bounded(GGUF, paths[name])
    assert error is not None
    assert peak < 16 << 20, peak
    expected = {
        "nul": "not a GGUF file",
        "zero": "is a link to /dev/zero, which is a character device, not a regular file",
        "fifo": "is a pipe (FIFO), not a regular file",
        "dangling": "does not exist",
        "empty": "too short for a GGUF header",
    }[name]
    assert expected in str(error), error
