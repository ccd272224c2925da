"""`kvscope bench --peer llama.cpp --models`: the bytes a decode step reads (tied and untied heads),
the thread counts, the table from a canned report, and one real tiny run without the peer.

No speed is asserted anywhere: the figures are checked for being measured, not for being fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from tiny_models import (
    add_byte_tokenizer,
    add_random_quant_tensors,
    byte_tokens,
    layer_matrices,
    make_quant_gguf,
)

from kvscope.app.bench.llama_cpp import peer_models
from kvscope.app.bench.llama_cpp.peer_models_setup import (
    MODEL_NAMES,
    ModelChoice,
    cpu_description,
    decode_weight_bytes,
    parse_model_names,
    thread_counts,
)
from kvscope.app.bench.llama_cpp.peer_models_table import (
    COLUMNS,
    finish_row,
    markdown_table,
    plot_peer_models,
)
from kvscope.engine.bench.synthetic_gguf import Shape, add_shape_metadata


def _tied_gguf(path: Path) -> Path:
    """A tiny Q8_0 Llama whose head is its embedding table: no output.weight."""
    tokens = byte_tokens()
    hidden, inter, layers = 64, 128, 2
    writer = gguf.GGUFWriter(path, "llama")
    add_shape_metadata(writer, Shape("tied", layers, hidden, inter, 4, 2, 512), 16)
    add_byte_tokenizer(writer, tokens)
    matrices = {"token_embd": ("Q8_0", len(tokens), hidden)}
    matrices |= layer_matrices(layers, hidden, 32, inter, lambda name: "Q8_0")
    add_random_quant_tensors(writer, matrices, layers, hidden, seed=1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _sizes(path: Path) -> dict[str, tuple[int, int]]:
    """{name: (bytes, rows)} read with gguf's own reader, not the engine's."""
    reader = gguf.GGUFReader(path)
    return {t.name: (int(t.n_bytes), int(t.shape[-1])) for t in reader.tensors}


def test_untied_head_counts_the_output_matrix_and_one_embedding_row(tmp_path):
    path = make_quant_gguf(tmp_path / "untied.gguf", "Q4_0")
    sizes = _sizes(path)
    assert "output.weight" in sizes
    embd_bytes, embd_rows = sizes.pop("token_embd.weight")
    expected = sum(b for b, _ in sizes.values()) + embd_bytes // embd_rows
    assert decode_weight_bytes(path) == expected
    # norms are counted too (negligible, but read every step)
    assert any("norm" in name for name in sizes)


def test_tied_head_counts_the_whole_embedding_table(tmp_path):
    path = _tied_gguf(tmp_path / "tied.gguf")
    sizes = _sizes(path)
    assert "output.weight" not in sizes
    assert decode_weight_bytes(path) == sum(b for b, _ in sizes.values())


def test_thread_counts_are_one_two_and_every_core_without_repeats():
    assert thread_counts(1) == [1]
    assert thread_counts(2) == [1, 2]
    assert thread_counts(3) == [1, 2, 3]
    assert thread_counts(16) == [1, 2, 16]
    with pytest.raises(ValueError, match="cores must be >= 1, got 0"):
        thread_counts(0)


def test_model_names_filter_names_the_unknown_one():
    assert parse_model_names(None) == MODEL_NAMES
    assert parse_model_names("1.1B, 3B") == ("1.1B", "3B")
    with pytest.raises(ValueError, match=r"unknown model\(s\) \['7B'\]"):
        parse_model_names("1.1B,7B")


def _canned_report(peer: bool) -> dict:
    def rounds(decode, prefill):
        return [
            {
                "decode_tokens": 63,
                "decode_s": 63 / d,
                "decode_tokens_per_s": d,
                "prompt_tokens": 512,
                "ttft_s": 512 / p,
                "prefill_tokens_per_s": p,
            }
            for d, p in zip(decode, prefill, strict=True)
        ]

    row = {
        "model": "1.1B-Q4_0",
        "file": "x.gguf",
        "threads": 2,
        "weight_bytes_per_token": 640 * 10**6,
        "tied_head": False,
        "kvscope": {"weights": "Q4_0", "rounds": rounds([40.0, 42.8, 41.0], [100.0, 128.0, 90.0])},
        "llama.cpp": {
            "version": "0.3.36",
            "rounds": rounds([53.2, 50.0, 52.0], [160.0, 150.0, 155.0]),
        }
        if peer
        else None,
    }
    return {
        "cpu": {
            "model_name": "Test CPU 9000",
            "isa": {"avx2": True, "avx512f": False},
            "physical_cores": 2,
        },
        "peer": {"name": "llama.cpp", "version": "0.3.36" if peer else None, "missing": "absent"},
        "settings": {"threads": [2], "rounds": 3, "decode_tokens": 64, "prompt_tokens": 512},
        "rows": [
            finish_row(row, 40e9),
            {"model": "gemma3-270m", "skipped": "not installed"},
        ],
    }


def test_table_from_a_canned_report(tmp_path):
    report = _canned_report(peer=True)
    row = report["rows"][0]
    assert row["kvscope"]["best"] == {
        "decode_tokens_per_s": 42.8,
        "prefill_tokens_per_s": 128.0,
        "ttft_s": 4.0,
    }
    assert row["ratio"]["decode"] == pytest.approx(42.8 / 53.2)
    assert row["roofline_tokens_per_s"] == pytest.approx(62.5)
    assert row["roofline_share"]["llama.cpp"] == pytest.approx(53.2 / 62.5)
    text = markdown_table(report)
    lines = text.splitlines()
    assert "Test CPU 9000" in lines[0] and "avx2" in lines[0] and "avx512f" not in lines[0]
    assert lines[2] == "| " + " | ".join(COLUMNS) + " |"
    cells = [c.strip() for c in lines[4].strip("|").split("|")]
    assert cells == [
        "1.1B-Q4_0",
        "2",
        "42.8 / 53.2",
        "x0.80",
        "128.0 / 160.0",
        "x0.80",
        "4.000 / 3.200",
        "68% / 85%",
        "40.0",
    ]
    assert "| gemma3-270m | — | skipped: not installed |" in lines[5]
    plot_peer_models(report, tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_without_the_peer_shows_our_figures_and_dashes(tmp_path):
    report = _canned_report(peer=False)
    cells = [c.strip() for c in markdown_table(report).splitlines()[4].strip("|").split("|")]
    assert cells[2:5] == ["42.8 / —", "—", "128.0 / —"]
    assert cells[7] == "68% / —"
    assert "absent" in markdown_table(report).splitlines()[0]
    plot_peer_models(report, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 0


def test_cpu_description_reads_the_model_name_and_isa_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU @ 2GHz\nflags\t\t: fpu avx2 amx_int8\n")
    cpu = cpu_description(info)
    assert cpu["model_name"] == "Some CPU @ 2GHz"
    assert cpu["isa"]["avx2"] and cpu["isa"]["amx_int8"] and not cpu["isa"]["avx512f"]


def _tiny_run(tmp_path, monkeypatch=None):
    path = make_quant_gguf(tmp_path / "q4_0.gguf", "Q4_0")
    if monkeypatch is not None:
        monkeypatch.setattr(peer_models, "llama_cpp_version", lambda: None)
    out = tmp_path / "out"
    report = peer_models.run_peer_models(
        out,
        [ModelChoice("tiny", path), ModelChoice("gone", None, "not here")],
        threads=[1],
        rounds=2,
        decode_tokens=5,
        prompt_tokens=40,
        bandwidth_bytes=16 << 20,
    )
    return path, out, report


def test_a_real_tiny_run_without_the_peer_writes_our_figures(tmp_path, monkeypatch):
    path, out, report = _tiny_run(tmp_path, monkeypatch)
    saved = json.loads((out / "bench_peer_models.json").read_text())
    assert saved == json.loads(json.dumps(report))
    assert (out / "bench_peer_models.png").is_file()
    assert saved["peer"]["version"] is None and "not installed" in saved["peer"]["missing"]
    row, skipped = saved["rows"]
    assert skipped == {"model": "gone", "skipped": "not here"}
    assert row["llama.cpp"] is None and row["ratio"] is None
    assert row["weight_bytes_per_token"] == decode_weight_bytes(path)
    assert row["bandwidth_gb_s"] > 0 and saved["bandwidth_gb_s"] == {"1": row["bandwidth_gb_s"]}
    ours = row["kvscope"]
    assert len(ours["rounds"]) == 2
    for r in ours["rounds"]:
        # 5 tokens greedy past EOS: the first comes with prefill, 4 are decode steps
        assert r["decode_tokens"] == 4 and r["decode_s"] > 0
        assert r["prompt_tokens"] == 40 and r["ttft_s"] > 0
        assert r["prefill_tokens_per_s"] == pytest.approx(40 / r["ttft_s"])
    assert ours["best"]["decode_tokens_per_s"] == max(
        r["decode_tokens_per_s"] for r in ours["rounds"]
    )
    assert row["roofline_share"]["kvscope"] == pytest.approx(
        ours["best"]["decode_tokens_per_s"] / row["roofline_tokens_per_s"]
    )
    assert "tiny | 1 |" in markdown_table(saved)


def test_a_real_tiny_run_against_llama_cpp(tmp_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    failed = peer_models.peer_failure(make_quant_gguf(tmp_path / "probe.gguf", "Q4_0"))
    if failed:  # an optional peer's broken build is the build's problem, not the bench's
        pytest.skip(failed)
    _, _, report = _tiny_run(tmp_path)
    assert report["rows"][0]["peer_failed"] is None
    row = report["rows"][0]
    theirs = row["llama.cpp"]
    assert theirs["version"] and len(theirs["rounds"]) == 2
    assert all(r["decode_tokens"] == 4 and r["prompt_tokens"] == 40 for r in theirs["rounds"])
    assert row["ratio"]["decode"] > 0 and row["ratio"]["prefill"] > 0
    assert 0 <= row["greedy_tokens_agreeing"] <= 5


def test_a_peer_that_dies_is_reported_not_fatal(tmp_path, monkeypatch):
    gguf_path = tmp_path / "m.gguf"
    monkeypatch.setattr(peer_models, "_PROBE", "import os, signal; os.kill(os.getpid(), 4)")
    assert peer_models.peer_failure(gguf_path) == (
        "llama.cpp died of SIGILL on m.gguf (its build uses instructions this CPU refuses)"
    )
    monkeypatch.setattr(peer_models, "_PROBE", "raise SystemExit('no such model')")
    assert peer_models.peer_failure(gguf_path) == (
        "llama.cpp failed on m.gguf (exit 1): no such model"
    )
    monkeypatch.setattr(peer_models, "_PROBE", "import sys; assert sys.argv[1].endswith('m.gguf')")
    assert peer_models.peer_failure(gguf_path) is None


def test_a_failed_peer_is_said_under_the_table():
    report = _canned_report(peer=False)
    report["rows"][0]["peer_failed"] = "llama.cpp died of SIGILL on x.gguf"
    lines = markdown_table(report).splitlines()
    assert lines[-1] == "1.1B-Q4_0: llama.cpp died of SIGILL on x.gguf"


def test_the_flag_pair_runs_the_table_and_bad_flags_name_their_value(tmp_path, capsys, monkeypatch):
    from kvscope.app.cli.main import main

    # the pair reaches this bench (and no other): its own checks answer before anything loads
    def not_run(*args, **kwargs):
        raise AssertionError("run_peer_models must not start on bad flags")

    monkeypatch.setattr(peer_models, "run_peer_models", not_run)
    argv = ["bench", "--peer", "llama.cpp", "--models", "--out", str(tmp_path)]
    assert main([*argv, "--models-only", "bundled,7B"]) == 2
    assert "unknown model(s) ['7B']" in capsys.readouterr().err
    assert main([*argv, "--rounds", "0"]) == 2
    assert "rounds must be >= 1, got 0" in capsys.readouterr().err
    assert main([*argv, "--num-threads", "0"]) == 2
    assert "got [0]" in capsys.readouterr().err
    assert not (tmp_path / "bench_peer_models.json").exists()


def test_the_cpu_is_read_once_for_name_and_flags(tmp_path):
    """One reader of /proc/cpuinfo serves the reports and the peer's build options."""
    from kvscope.app.bench.cpu_model import cpu_flags, cpu_model_name
    from kvscope.app.bench.llama_cpp.build import cmake_options

    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: Chip A\nflags\t\t: avx2 fma\n\n"
        "processor\t: 1\nmodel name\t: Chip A\nflags\t\t: avx2 fma\n"
    )
    assert cpu_model_name(info) == "Chip A" and cpu_flags(info) == {"avx2", "fma"}
    assert cpu_flags(tmp_path / "missing") == set()
    assert "-DGGML_AVX2=ON" in cmake_options(cpu_flags(info))
