"""Fit verdicts from a GGUF header read over HTTP Range, checked against real loads: a file judged
to fit loads with the context it promised, and a file judged not to fit is refused by the engine's
own fit check, both under the same faked free-memory reading."""

from pathlib import Path

import pytest
from fake_hub import FakeHub
from huggingface_hub import hf_hub_download
from sized_gguf import sized_shape, write_sized_gguf
from split_gguf import write_split_gguf
from tiny_models import make_quant_gguf

from kvscope.app.core.hub.search import judge_file, list_files
from kvscope.engine import LLM
from kvscope.engine.config import EngineConfig
from kvscope.engine.memory.model_too_large import ModelTooLargeError
from kvscope.engine.model.gguf.file import FIRST_HEADER_READ
from kvscope.engine.sizing import model_build, planner
from kvscope.engine.sizing.weight_fit import resolve_for_weights, weight_fit

CPU = EngineConfig(device="cpu")
REPO = "someone/Tiny-Chat-GGUF"
FILE = "Tiny-Chat-Q8_0.gguf"
BLOCK = 16  # the engine's default block size, in tokens


def fake_free_ram(monkeypatch: pytest.MonkeyPatch, available: int) -> None:
    """MemAvailable as the engine reads it: for its fit check at load, and for the verdict."""
    monkeypatch.setattr(model_build, "system_memory", lambda: (64 << 30, available))


def load_need_and_block(path: Path) -> tuple[int, int]:
    """(bytes a CPU load needs besides its KV pool, bytes of one KV block) for a local file."""
    header = planner.weights_header(path)
    assert header is not None
    mc = planner.model_config(path)
    config = resolve_for_weights(CPU, header)
    fit = weight_fit(config, header, mc.tie_word_embeddings)
    kv_dtype = planner.dtype_name(config.kv_torch_dtype)
    per_token = planner.bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim, kv_dtype)
    return fit.plan.total_bytes + fit.overhead_bytes, BLOCK * per_token


@pytest.fixture
def tiny_repo(fake_hub: FakeHub, tmp_path: Path) -> Path:
    """A tiny Llama (2 layers, 512-token context, 1 KiB of bf16 KV per token) on the hub."""
    path = make_quant_gguf(tmp_path / FILE, "Q8_0")
    fake_hub.add_repo(REPO, {FILE: path.read_bytes()}, license="apache-2.0")
    return path


def test_a_file_judged_to_fit_loads_with_the_context_it_promised(
    fake_hub: FakeHub, tiny_repo: Path, monkeypatch: pytest.MonkeyPatch
):
    need, block = load_need_and_block(tiny_repo)
    fake_free_ram(monkeypatch, need + 40 * block + block // 2)  # 640 tokens of KV room
    [hub_file] = list_files(REPO)

    verdict = judge_file(hub_file, CPU)

    assert verdict.fits and verdict.runnable and verdict.device == "cpu"
    assert (verdict.max_context, verdict.typical_context, verdict.sequences) == (512, 512, 1)
    assert verdict.kv_cache_bytes == 32 * block
    assert "one sequence can hold 512 tokens, the model's limit" in verdict.note
    path = hf_hub_download(REPO, FILE)
    llm = LLM(
        model=path,
        device="cpu",
        max_model_len=verdict.max_context,
        kv_cache_memory=verdict.kv_cache_bytes,
    )
    assert llm.engine.max_seq_len == verdict.max_context


def test_a_short_context_is_promised_exactly(
    fake_hub: FakeHub, tiny_repo: Path, monkeypatch: pytest.MonkeyPatch
):
    need, block = load_need_and_block(tiny_repo)
    fake_free_ram(monkeypatch, need + 20 * block + block // 2)  # 320 tokens, not the 512
    [hub_file] = list_files(REPO)

    verdict = judge_file(hub_file, CPU)

    assert not verdict.fits and verdict.runnable
    assert (verdict.max_context, verdict.sequences) == (320, 0)
    assert verdict.note.startswith("does not fit a 512-token sequence")
    path = hf_hub_download(REPO, FILE)
    llm = LLM(model=path, device="cpu", max_model_len=320, kv_cache_memory=verdict.kv_cache_bytes)
    assert llm.engine.max_seq_len == 320
    del llm
    with pytest.raises(ModelTooLargeError):  # one block more than promised does not load
        LLM(
            model=path,
            device="cpu",
            max_model_len=320 + BLOCK,
            kv_cache_memory=verdict.kv_cache_bytes + block,
        )


def test_a_file_judged_not_to_fit_is_refused_by_the_engine(
    fake_hub: FakeHub, tiny_repo: Path, monkeypatch: pytest.MonkeyPatch
):
    need, block = load_need_and_block(tiny_repo)
    fake_free_ram(monkeypatch, need - (1 << 20))
    [hub_file] = list_files(REPO)

    verdict = judge_file(hub_file, CPU)

    assert not verdict.fits and verdict.runnable
    assert (verdict.max_context, verdict.sequences, verdict.kv_cache_bytes) == (0, 0, 0)
    assert verdict.note.startswith("does not fit: loading needs")
    path = hf_hub_download(REPO, FILE)
    with pytest.raises(ModelTooLargeError, match="needs about"):
        LLM(model=path, device="cpu", max_model_len=BLOCK, kv_cache_memory=block)


def test_the_header_is_read_with_range_requests_only(
    fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    path = write_sized_gguf(tmp_path / "Mid-Q4_K_M.gguf", sized_shape("mid", 4, 1024, 2816))
    fake_hub.add_repo("someone/Mid-GGUF", {path.name: path.read_bytes()})
    fake_free_ram(monkeypatch, 16 << 30)
    [hub_file] = list_files("someone/Mid-GGUF")
    fake_hub.reset_counts()

    verdict = judge_file(hub_file, CPU)

    served = fake_hub.bytes_served(path.name)
    size = path.stat().st_size
    assert served <= FIRST_HEADER_READ and served * 100 < size  # 256 KiB of 27 MB
    content = [r for r in fake_hub.requests if r.path.startswith("/cdn/")]  # the file's bytes
    assert content and all(r.status == 206 and "Range" in r.headers for r in content)
    assert verdict.fits and verdict.max_context == 2048 and verdict.typical_context == 2048


def test_a_split_file_is_judged_from_every_part_header(
    fake_hub: FakeHub, tiny_repo: Path, monkeypatch: pytest.MonkeyPatch
):
    parts = write_split_gguf(tiny_repo, tiny_repo.parent / "parts", max_tensors=8)
    fake_hub.add_repo("other/Split-GGUF", {p.name: p.read_bytes() for p in parts})
    fake_free_ram(monkeypatch, 16 << 30)
    [hub_file] = list_files("other/Split-GGUF")
    fake_hub.reset_counts()

    verdict = judge_file(hub_file, CPU)
    [single] = list_files(REPO)
    whole = judge_file(single, CPU)

    assert all(0 < fake_hub.bytes_served(p.name) <= FIRST_HEADER_READ for p in parts)
    # The engine loads a split model from its parts: judged as the file in one piece is.
    assert verdict.runnable and verdict.fits == whole.fits
    assert "merge" not in verdict.note
    # Sized from all the parts' tensors: the same weights as the file in one piece.
    assert verdict.weight_bytes == whole.weight_bytes
    assert verdict.max_context == whole.max_context == 512
