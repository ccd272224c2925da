"""`kvscope pull`: the path as the last line, errors in words, and a kill -9 then a rerun that
fetches only the missing bytes."""

import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fake_hub import FakeHub
from huggingface_hub import try_to_load_from_cache
from split_gguf import write_split_gguf
from tiny_models import make_quant_gguf

from kvscope.app.cli.main import main
from kvscope.engine import LLM, SamplingParams
from kvscope.engine.child_python import python_module_command

MIB = 1 << 20
CHUNK = 64 << 10  # slack for bytes received but not yet in the partial file when the kill lands
REPO = "org/Tiny-GGUF"
Q4 = "Tiny-Q4_K_M.gguf"


def test_the_last_line_is_the_local_path(
    fake_hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = hashlib.shake_256(b"q8").digest(50_000)
    commit = fake_hub.add_repo(REPO, {Q4: b"q4", "Tiny-Q8_0.gguf": data})
    assert main(["pull", f"{REPO}:Q8_0"]) == 0
    out, err = capsys.readouterr()
    path = tmp_path / "hf/hub/models--org--Tiny-GGUF/snapshots" / commit / "Tiny-Q8_0.gguf"
    assert out.splitlines()[-1] == str(path)
    assert path.read_bytes() == data
    assert "Tiny-Q8_0.gguf" in err and err.splitlines()[-1].endswith("done")


def test_a_split_model_pulled_loads_and_answers_as_one_file(
    fake_hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = make_quant_gguf(tmp_path / "Tiny-Q8_0.gguf", "Q8_0")
    parts = write_split_gguf(whole, tmp_path / "parts", max_tensors=8)
    fake_hub.add_repo(REPO, {p.name: p.read_bytes() for p in parts})
    assert main(["pull", f"{REPO}:Q8_0"]) == 0
    first = Path(capsys.readouterr().out.splitlines()[-1])
    assert first.name == parts[0].name and len(list(first.parent.glob("*.gguf"))) == 3
    greedy = SamplingParams(temperature=0, max_tokens=8)
    replies = [
        LLM(model=str(model), device="cpu", num_kv_blocks=16).generate([[5, 17, 42]], greedy)
        for model in (first, whole)
    ]
    assert replies[0][0].outputs[0].token_ids == replies[1][0].outputs[0].token_ids


def test_errors_are_one_line_in_words(
    fake_hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_hub.add_repo(REPO, {Q4: b"q4", "Tiny-Q8_0.gguf": b"q8"})
    assert main(["pull", f"{REPO}:Q5_K_S"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines()[-1] == (
        f"error: {REPO} has no Q5_K_S quant. The quants there are: Q4_K_M, Q8_0."
    )
    assert main(["pull", "not-a-repo"]) == 1
    assert "write it as ORG/NAME or ORG/NAME:QUANT" in capsys.readouterr().err


def test_kill_9_mid_download_then_a_rerun_fetches_only_the_missing_bytes(
    fake_hub: FakeHub, tmp_path: Path
) -> None:
    data = hashlib.shake_256(b"weights").digest(6 * MIB + 123)
    commit = fake_hub.add_repo(REPO, {Q4: data, "Tiny-Q8_0.gguf": b"q8"})
    stall_at = 3 * MIB + MIB // 2
    fake_hub.set_faults(REPO, Q4, stall_after_bytes=stall_at, stall_s=60)
    env = {**os.environ, **fake_hub.env(tmp_path / "hf")}
    command = python_module_command("kvscope.app.cli", "pull", REPO)
    blobs = tmp_path / "hf/hub/models--org--Tiny-GGUF/blobs"
    partial = blobs / (hashlib.sha256(data).hexdigest() + ".kvscope.incomplete")

    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: fake_hub.bytes_served(Q4) == stall_at)
        wait_for(lambda: partial.is_file() and partial.stat().st_size >= stall_at - CHUNK)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.communicate(timeout=10)
    assert child.returncode == -signal.SIGKILL
    first_run = fake_hub.bytes_served(Q4)
    kept = partial.stat().st_size
    assert 0 < kept <= first_run
    assert not [p for p in (tmp_path / "hf/hub").rglob("snapshots/**/*") if not p.is_dir()]

    fake_hub.clear_faults()
    fake_hub.reset_counts()
    rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    path = tmp_path / "hf/hub/models--org--Tiny-GGUF/snapshots" / commit / Q4
    assert rerun.stdout.splitlines()[-1] == str(path)
    assert path.read_bytes() == data
    second_run = fake_hub.bytes_served(Q4)
    # The rerun asked exactly for what the partial file lacked: the bytes the killed run never
    # got, plus at most the one chunk it had in hand.
    assert second_run == len(data) - kept
    assert first_run + second_run <= len(data) + CHUNK
    ranges = [r.headers.get("Range") for r in fake_hub.requests if "/cdn/" in r.path]
    assert ranges == [f"bytes={kept}-"]
    assert try_to_load_from_cache(REPO, Q4, cache_dir=tmp_path / "hf/hub") == str(path)
    assert sorted(p.name for p in blobs.iterdir()) == [hashlib.sha256(data).hexdigest()]


def wait_for(condition, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
