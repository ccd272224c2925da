"""The benchmark's workload reader under the fuzz harness (tests/fuzz_readers.py): `kvscope
record` and `kvscope bench --workload` read it before loading a model; a bad file is a
ValueError naming it (a FileNotFoundError when missing), which the command prints."""

from __future__ import annotations

import pytest
from fuzz_readers import (
    Reader,
    check_corpus,
    check_refused_path,
    fuzz,
)

from kvscope.app.bench.workload import load_chat_workload

WORKLOAD = Reader("workload", load_chat_workload, (ValueError,), ".json")


def test_the_corpus_reads_or_is_refused_within_bounds(tmp_path):
    peaks = check_corpus(WORKLOAD, tmp_path)
    assert len(peaks) >= 11


def test_mutated_workloads_read_or_are_refused(tmp_path):
    fuzz(WORKLOAD, tmp_path, examples=300)


@pytest.mark.parametrize("name", ["nul", "zero", "fifo", "folder", "dangling", "empty"])
def test_a_path_that_is_no_workload_is_refused_before_it_is_read(tmp_path, name):
    check_refused_path(
        WORKLOAD,
        tmp_path,
        name,
        {
            "nul": "this reader takes files up to 16.0 MiB",
            "dangling": "workload file does not exist",
            "empty": "is not a JSON workload",
        },
    )


def test_kvscope_bench_refuses_a_bad_workload_with_its_reason(tmp_path, capsys):
    from kvscope.app.bench.run import run_bench
    from kvscope.app.cli.main import build_parser

    bad = tmp_path / "workload.json"
    bad.write_text('{"chat": 5}')
    args = build_parser().parse_args(["bench", "--workload", str(bad), "--out", str(tmp_path)])
    assert run_bench(args) == 2  # before any model loads
    err = capsys.readouterr().err
    assert "no non-empty 'chat' list" in err and "Traceback" not in err
