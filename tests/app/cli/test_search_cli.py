"""`kvscope search` against the fake hub: one JSON row per file with its verdict, the table, the
curated list, errors in words, and a child process that finds the hub through HF_ENDPOINT."""

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_hub import FakeHub, point_huggingface_hub_at
from split_gguf import write_split_gguf
from tiny_models import make_quant_gguf

from kvscope.app.cli.main import main
from kvscope.app.core.hub.search import curated_models
from kvscope.engine.child_python import python_module_command
from kvscope.engine.sizing import model_build

ROW_FIELDS = {"repo", "file", "quant", "size_bytes", "sha256", "fits", "max_context", "note"}


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A fake hub with a tiny chat model in two quants and a split one; 16 GiB of free RAM, for
    verdicts that do not depend on this machine's."""
    q8 = make_quant_gguf(tmp_path / "Tiny-Chat-Q8_0.gguf", "Q8_0")
    q2 = make_quant_gguf(tmp_path / "Tiny-Chat-Q2_K.gguf", "Q2_K")  # a type the engine lacks
    parts = write_split_gguf(q8, tmp_path / "parts", max_tensors=8)
    with FakeHub() as fake:
        point_huggingface_hub_at(fake, tmp_path / "hf", monkeypatch)
        fake.add_repo(
            "someone/Tiny-Chat-GGUF",
            {q8.name: q8.read_bytes(), q2.name: q2.read_bytes(), "mmproj-f16.gguf": b"GGUF"},
            downloads=50,
            license="apache-2.0",
        )
        fake.add_repo("other/Tiny-Split-GGUF", {p.name: p.read_bytes() for p in parts})
        monkeypatch.setattr(model_build, "system_memory", lambda: (32 << 30, 16 << 30))
        yield fake


def test_search_json_gives_one_row_per_file_with_its_verdict(hub: FakeHub, capsys):
    assert main(["search", "tiny", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_file = {row["file"]: row for row in rows}
    assert set(by_file) == {
        "Tiny-Chat-Q2_K.gguf",
        "Tiny-Chat-Q8_0.gguf",
        "Tiny-Chat-Q8_0-00001-of-00003.gguf",
    }
    assert all(ROW_FIELDS <= set(row) for row in rows)
    q8 = by_file["Tiny-Chat-Q8_0.gguf"]
    assert (q8["quant"], q8["fits"], q8["max_context"], q8["license"]) == (
        "Q8_0",
        True,
        512,
        "apache-2.0",
    )
    assert len(q8["sha256"]) == 64 and q8["runnable"] is True
    q2 = by_file["Tiny-Chat-Q2_K.gguf"]
    assert q2["fits"] is False and q2["runnable"] is False and "Q2_K" in q2["note"]
    split = by_file["Tiny-Chat-Q8_0-00001-of-00003.gguf"]
    # A split model runs from its parts: judged as the file in one piece.
    assert len(split["parts"]) == 3 and split["runnable"] is True and split["fits"] == q8["fits"]


def test_search_table_and_quant_filter(hub: FakeHub, capsys):
    assert main(["search", "tiny", "--quant", "q8_0"]) == 0
    out = capsys.readouterr().out
    assert "someone/Tiny-Chat-GGUF  (50 downloads, 0 likes, apache-2.0" in out
    assert "Q2_K" not in out
    [line] = [line for line in out.splitlines() if line.strip().endswith("Tiny-Chat-Q8_0.gguf")]
    assert line.split()[:4] == ["Q8_0", "0.00", "GiB", "fits"]
    assert "512 ctx" in line


def test_search_without_query_lists_the_curated_models(hub: FakeHub, tmp_path: Path, capsys):
    first = curated_models()[0]
    q8 = tmp_path / "Tiny-Chat-Q8_0.gguf"
    hub.add_repo(first.repo, {"model-Q8_0.gguf": q8.read_bytes()}, license=first.license)
    assert main(["search", "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(first.repo) and first.description in out
    assert main(["search", "--limit", "2"]) == 1  # the second is not on this hub
    err = capsys.readouterr().err
    assert err.startswith(f"error: {curated_models()[1].repo} was not found on {hub.url}")


def test_search_in_a_child_process_finds_the_hub_through_hf_endpoint(hub: FakeHub, tmp_path):
    env = {**os.environ, **hub.env(tmp_path / "child_hf"), "CUDA_VISIBLE_DEVICES": ""}
    cmd = python_module_command("kvscope.app.cli", "search", "chat", "--json")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert {row["file"] for row in rows} == {"Tiny-Chat-Q2_K.gguf", "Tiny-Chat-Q8_0.gguf"}
    for row in rows:  # this machine's real free memory: the verdict's types, and its reason
        assert isinstance(row["fits"], bool) and isinstance(row["max_context"], int)
        assert row["note"] and row["device"] == "cpu"
