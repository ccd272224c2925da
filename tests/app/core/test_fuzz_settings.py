"""The settings file's reader under the fuzz harness (tests/fuzz_readers.py): the window loads
it at start and falls back to the defaults on a ValueError, which it shows; anything else would
keep the app from starting."""

from __future__ import annotations

import pytest
from fuzz_readers import (
    Reader,
    check_corpus,
    check_refused_path,
    fuzz,
    hostile_paths,
)

from kvscope.app.core.settings import load_settings

SETTINGS = Reader("settings", load_settings, (ValueError,), ".json")


def test_the_corpus_reads_or_is_refused_within_bounds(tmp_path):
    peaks = check_corpus(SETTINGS, tmp_path)
    assert len(peaks) >= 11


def test_mutated_settings_read_or_are_refused(tmp_path):
    fuzz(SETTINGS, tmp_path, examples=400)


@pytest.mark.parametrize("name", ["nul", "zero", "fifo", "folder", "empty"])
def test_a_path_that_is_no_settings_file_is_refused_before_it_is_read(tmp_path, name):
    check_refused_path(
        SETTINGS,
        tmp_path,
        name,
        {"nul": "this reader takes files up to 1.0 MiB", "empty": "Expecting value"},
    )


def test_a_dangling_link_reads_as_no_settings(tmp_path):
    paths = hostile_paths(tmp_path, ".json", special=False)
    assert load_settings(paths["dangling"]) == load_settings(tmp_path / "none.json")
