"""The fake hub speaks what huggingface_hub asks for: checked with huggingface_hub's own client."""

import hashlib
from pathlib import Path

import httpx2
import pytest
from fake_hub import FakeHub
from huggingface_hub import HfApi, hf_hub_download, try_to_load_from_cache
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

WEIGHTS = bytes(range(256)) * 4096  # 1 MiB, more than one send block is not needed here


def test_search_lists_gguf_repos_matching_the_query(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("org/Small-GGUF", {"small.gguf": b"x"}, downloads=10, license="mit")
    fake_hub.add_repo("org/Big-GGUF", {"big.gguf": b"y"}, downloads=99, likes=3)
    fake_hub.add_repo("org/small-safetensors", {"model.safetensors": b"z"}, tags=["safetensors"])

    found = list(HfApi().list_models(filter="gguf", search="gguf", sort="downloads", limit=5))
    assert [m.id for m in found] == ["org/Big-GGUF", "org/Small-GGUF"]
    assert found[0].downloads == 99 and found[0].likes == 3
    small = list(HfApi().list_models(filter="gguf", search="small", expand=["lastModified"]))
    assert [m.id for m in small] == ["org/Small-GGUF"]
    assert small[0].last_modified is not None and small[0].downloads is None


def test_model_info_and_tree_give_sizes_and_lfs_sha256(fake_hub: FakeHub) -> None:
    commit = fake_hub.add_repo(
        "org/Model-GGUF",
        {"README.md": b"# card", "model-Q4_K_M.gguf": WEIGHTS, "sub/part.gguf": b"p" * 10},
        gated=True,
        license="apache-2.0",
    )
    info = HfApi().model_info("org/Model-GGUF", files_metadata=True)
    assert info.sha == commit and info.gated == "manual"
    assert info.card_data is not None and info.card_data.license == "apache-2.0"
    by_name = {s.rfilename: s for s in info.siblings or []}
    weights = by_name["model-Q4_K_M.gguf"]
    assert weights.size == len(WEIGHTS) and weights.lfs is not None
    assert weights.lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    assert by_name["README.md"].lfs is None

    tree = list(HfApi().list_repo_tree("org/Model-GGUF", recursive=True))
    files = {e.path: e for e in tree if hasattr(e, "lfs")}
    assert set(files) == {"README.md", "model-Q4_K_M.gguf", "sub/part.gguf"}
    assert files["model-Q4_K_M.gguf"].lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    assert files["model-Q4_K_M.gguf"].size == len(WEIGHTS)
    top = [e.path for e in HfApi().list_repo_tree("org/Model-GGUF")]
    assert "sub" in top and "sub/part.gguf" not in top


def test_hf_hub_download_lands_in_the_cache_through_the_cdn_redirect(
    fake_hub: FakeHub, hf_cache: Path
) -> None:
    commit = fake_hub.add_repo("org/Model-GGUF", {"model-Q4_K_M.gguf": WEIGHTS})
    path = Path(hf_hub_download("org/Model-GGUF", "model-Q4_K_M.gguf"))
    assert path == hf_cache / "models--org--Model-GGUF" / "snapshots" / commit / "model-Q4_K_M.gguf"
    assert path.read_bytes() == WEIGHTS
    blob = hf_cache / "models--org--Model-GGUF" / "blobs" / hashlib.sha256(WEIGHTS).hexdigest()
    assert path.resolve() == blob
    assert fake_hub.bytes_served("model-Q4_K_M.gguf") == len(WEIGHTS)
    assert any(r.path.startswith("/cdn/") for r in fake_hub.requests)
    assert try_to_load_from_cache("org/Model-GGUF", "model-Q4_K_M.gguf") == str(path)
    again = hf_hub_download("org/Model-GGUF", "model-Q4_K_M.gguf", local_files_only=True)
    assert again == str(path)


def test_ranges_are_answered_with_206_and_416(fake_hub: FakeHub) -> None:
    fake_hub.cdn_redirect = False
    fake_hub.add_repo("org/Model-GGUF", {"m.gguf": WEIGHTS})
    url = f"{fake_hub.url}/org/Model-GGUF/resolve/main/m.gguf"
    part = httpx2.get(url, headers={"Range": "bytes=10-19"})
    assert part.status_code == 206 and part.content == WEIGHTS[10:20]
    assert part.headers["Content-Range"] == f"bytes 10-19/{len(WEIGHTS)}"
    tail = httpx2.get(url, headers={"Range": f"bytes={len(WEIGHTS) - 5}-"})
    assert tail.content == WEIGHTS[-5:]
    beyond = httpx2.get(url, headers={"Range": f"bytes={len(WEIGHTS)}-"})
    assert (
        beyond.status_code == 416 and beyond.headers["Content-Range"] == f"bytes */{len(WEIGHTS)}"
    )


def test_errors_carry_the_hub_error_codes(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("org/Gated-GGUF", {"m.gguf": b"g"}, gated=True)
    fake_hub.add_repo("org/Open-GGUF", {"m.gguf": b"o"})
    with pytest.raises(GatedRepoError) as anonymous:
        hf_hub_download("org/Gated-GGUF", "m.gguf")
    assert anonymous.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as refused:
        hf_hub_download("org/Gated-GGUF", "m.gguf", token="hf_not_granted")
    assert refused.value.response.status_code == 403
    fake_hub.grant("org/Gated-GGUF", "hf_granted")
    assert (
        Path(hf_hub_download("org/Gated-GGUF", "m.gguf", token="hf_granted")).read_bytes() == b"g"
    )
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("org/Missing-GGUF", "m.gguf")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download("org/Open-GGUF", "other.gguf")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download("org/Open-GGUF", "m.gguf", revision="v9")


def test_faults_cut_stall_and_corrupt_the_content(fake_hub: FakeHub) -> None:
    fake_hub.cdn_redirect = False
    fake_hub.add_repo("org/Model-GGUF", {"m.gguf": WEIGHTS})
    url = f"{fake_hub.url}/org/Model-GGUF/resolve/main/m.gguf"
    fake_hub.set_faults("org/Model-GGUF", "m.gguf", drop_after_bytes=1000)
    with pytest.raises(httpx2.RemoteProtocolError):
        httpx2.get(url)
    assert fake_hub.bytes_served("m.gguf") == 1000
    assert httpx2.get(url).content == WEIGHTS  # the drop fired once
    fake_hub.set_faults("org/Model-GGUF", "m.gguf", stall_after_bytes=500, stall_s=5)
    with pytest.raises(httpx2.ReadTimeout):
        httpx2.get(url, timeout=httpx2.Timeout(5, read=0.3))
    fake_hub.set_faults("org/Model-GGUF", "m.gguf", corrupt_at=7)
    body = httpx2.get(url).content
    assert len(body) == len(WEIGHTS) and body[7] != WEIGHTS[7] and body[8:] == WEIGHTS[8:]
    fake_hub.set_faults("org/Model-GGUF", "m.gguf", status=503)
    assert httpx2.get(url).status_code == 503
