"""GGUF headers under the fuzz harness (tests/fuzz_readers.py): what the settings dialog's
model picker, `kvscope plan` and the loader read before any tensor data (the config, the
weights' shapes and kinds, the tensor types) ends in a result or the ValueError they show."""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzz_readers import (
    Reader,
    check_corpus,
    check_refused_path,
    fuzz,
)

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
    check_refused_path(
        GGUF,
        tmp_path,
        name,
        {
            "nul": "not a GGUF file",
            "dangling": "does not exist",
            "empty": "too short for a GGUF header",
        },
    )
