"""Hub search against the fake hub: repos and their model files (quants, split GGUFs as one entry,
projectors left out), errors in words, and the curated list's shape."""

import hashlib
from pathlib import Path

import pytest
from fake_hub import FakeHub
from huggingface_hub import constants
from split_gguf import write_split_gguf
from tiny_models import make_quant_gguf

from kvscope.app.core.hub.search import (
    HubSearchError,
    curated_models,
    judge_file,
    judge_files,
    list_files,
    search_models,
)
from kvscope.app.core.hub.search_files import TreeFile, model_files, quant_of
from kvscope.engine.config import EngineConfig

CPU = EngineConfig(device="cpu")


@pytest.fixture
def tiny_q8(tmp_path: Path) -> Path:
    return make_quant_gguf(tmp_path / "Tiny-Chat-Q8_0.gguf", "Q8_0")


def test_search_lists_gguf_repos_by_downloads_with_one_entry_per_model(
    fake_hub: FakeHub, tiny_q8: Path, tmp_path: Path
):
    q4 = make_quant_gguf(tmp_path / "q4.gguf", "Q4_K", types={"attn_v": "Q6_K"}).read_bytes()
    fake_hub.add_repo(
        "someone/Tiny-Chat-GGUF",
        {
            "Tiny-Chat-Q8_0.gguf": tiny_q8.read_bytes(),
            "Tiny-Chat-Q4_K_M.gguf": q4,
            "mmproj-Tiny-Chat-f16.gguf": b"GGUF" + bytes(60),  # a vision projector: no model
            "README.md": b"# Tiny chat\n",
        },
        downloads=500,
        likes=7,
        license="apache-2.0",
    )
    parts = write_split_gguf(tiny_q8, tmp_path / "parts", max_tensors=8)
    fake_hub.add_repo(
        "other/Tiny-Big-GGUF",
        {f"Q8_0/{p.name}": p.read_bytes() for p in reversed(parts)},
        downloads=900,
        license="llama3.2",
    )
    fake_hub.add_repo("third/Tiny-Chat", {"model.safetensors": b"x"}, tags=["safetensors"])

    repos = search_models("tiny")

    assert [r.repo for r in repos] == ["other/Tiny-Big-GGUF", "someone/Tiny-Chat-GGUF"]
    big, chat = repos
    assert (chat.downloads, chat.likes, chat.license) == (500, 7, "apache-2.0")
    assert chat.updated is not None and chat.updated.startswith("2026-11-01")
    assert [(f.file, f.quant, f.size_bytes) for f in chat.files] == [
        ("Tiny-Chat-Q4_K_M.gguf", "Q4_K_M", len(q4)),
        ("Tiny-Chat-Q8_0.gguf", "Q8_0", tiny_q8.stat().st_size),
    ]
    assert chat.files[1].sha256 == hashlib.sha256(tiny_q8.read_bytes()).hexdigest()
    [split] = big.files
    assert split.parts == [f"Q8_0/{p.name}" for p in parts]  # in order, not as listed
    assert split.file == split.parts[0] and split.quant == "Q8_0"
    assert split.size_bytes == sum(p.stat().st_size for p in parts)
    assert split.sha256 == hashlib.sha256(parts[0].read_bytes()).hexdigest()
    assert big.license == "llama3.2"


def test_file_names_give_quants_and_split_parts():
    names = {
        "Llama-3.2-1B-Instruct-Q4_K_M.gguf": "Q4_K_M",
        "qwen2.5-0.5b-instruct-q8_0.gguf": "Q8_0",
        "mistral-7b-instruct-v0.2.Q5_K_S.gguf": "Q5_K_S",
        "SmolLM2-1.7B-Instruct-IQ4_XS.gguf": "IQ4_XS",
        "gemma-3-4b-it-f16.gguf": "F16",
        "Mistral-7B-Instruct-v0.3.fp16.gguf": "F16",
        "Qwen3-4B-BF16.gguf": "BF16",
        "gemma-3-4b-it-UD-Q4_K_XL.gguf": "UD-Q4_K_XL",
        "Q4_K_M/Qwen2.5-7B-Instruct-Q4_K_M-00001-of-00002.gguf": "Q4_K_M",
        "ggml-model.gguf": None,
    }
    assert {name: quant_of(name) for name in names} == names
    tree = [
        TreeFile("m-Q8_0-00002-of-00002.gguf", 5, "b"),
        TreeFile("m-Q8_0-00001-of-00002.gguf", 7, "a"),
        TreeFile("m-Q4_0-00001-of-00002.gguf", 3, "c"),  # its second part is missing
        TreeFile("mmproj-model-f16.gguf", 9, "d"),
        TreeFile("m-Q6_K.gguf", 4, "e"),
    ]
    found = [(m.path, [p.path for p in m.parts], m.size) for m in model_files(tree)]
    assert found == [
        ("m-Q6_K.gguf", ["m-Q6_K.gguf"], 4),
        (
            "m-Q8_0-00001-of-00002.gguf",
            ["m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf"],
            12,
        ),
    ]


def test_hub_errors_are_said_in_words(
    fake_hub: FakeHub, tiny_q8: Path, monkeypatch: pytest.MonkeyPatch
):
    fake_hub.add_repo("corp/Gated-GGUF", {"gated-Q8_0.gguf": tiny_q8.read_bytes()}, gated=True)
    fake_hub.add_repo("someone/Open-GGUF", {"open-Q8_0.gguf": tiny_q8.read_bytes()})
    [gated] = list_files("corp/Gated-GGUF")  # a gated repo's file list is public
    [open_file] = list_files("someone/Open-GGUF")
    with pytest.raises(
        HubSearchError,
        match=r"corp/Gated-GGUF is gated \(HTTP 401\): no token was sent\. Accept the licence",
    ):
        judge_file(gated, CPU)
    verdict, error = judge_files([open_file, gated], CPU)
    assert not isinstance(verdict, HubSearchError) and verdict.runnable
    assert isinstance(error, HubSearchError) and "set a token" in error.message
    fake_hub.add_repo("someone/Broken-GGUF", {"broken-Q4_K_M.gguf": b"PK" + bytes(1 << 16)})
    [broken] = list_files("someone/Broken-GGUF")
    refused = judge_file(broken, CPU)
    assert not refused.fits and not refused.runnable
    assert refused.note.startswith("cannot run here: broken-Q4_K_M.gguf: not a GGUF file")
    with pytest.raises(HubSearchError, match="nobody/none was not found on"):
        list_files("nobody/none")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubSearchError, match="offline: HF_HUB_OFFLINE"):
        search_models("tiny")
    before = len(fake_hub.requests)
    with pytest.raises(HubSearchError, match="offline"):
        judge_file(open_file, CPU)
    assert len(fake_hub.requests) == before  # offline asks nothing


def test_curated_models_are_repos_with_licences():
    curated = curated_models()
    assert len(curated) >= 8
    repos = [m.repo for m in curated]
    assert len(set(repos)) == len(repos)
    for model in curated:
        owner, _, name = model.repo.partition("/")
        assert owner and name and "/" not in name, model.repo
        assert name.lower().endswith("gguf"), model.repo
        assert model.license and model.description and model.files == []


def test_a_hub_that_does_not_answer_is_said_at_once_without_retries(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    import socket

    with socket.socket() as bound:  # a port nothing listens on, held so nobody takes it
        bound.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{bound.getsockname()[1]}"
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        with pytest.raises(HubSearchError, match=rf"cannot reach {endpoint} \(ConnectError"):
            search_models("tiny")
    # huggingface_hub's backoff logs each retry ("Retrying in 1s [Retry 1/5]"): none happened.
    assert not [r for r in caplog.records if "Retry" in r.getMessage()]
    assert fake_hub.requests == []
