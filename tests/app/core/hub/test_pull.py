"""`Pull` against the fake hub: the standard cache layout, resume, verification, faults, errors."""

import errno
import hashlib
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from fake_hub import FakeHub
from huggingface_hub import hf_hub_download, scan_cache_dir, try_to_load_from_cache

from kvscope.app.core.hub import blob_sink, pull
from kvscope.app.core.hub.http_range import RetryPolicy
from kvscope.app.core.hub.pull import (
    Pull,
    PullCancelled,
    PullError,
    PullProgress,
    cached_ggufs,
    pending_partials,
    pick_file,
)

MIB = 1 << 20
REPO = "org/Tiny-GGUF"
Q4 = "Tiny-Q4_K_M.gguf"
FAST = RetryPolicy(stall_timeout_s=0.5, retry_base_s=0.01, retry_cap_s=0.05, max_failures=3)


def weights(size: int, seed: int = 0) -> bytes:
    """Bytes that differ at every offset, so a byte from the wrong place is noticed."""
    return hashlib.shake_256(f"weights {seed}".encode()).digest(size)


@pytest.fixture
def q4() -> bytes:
    return weights(3 * MIB + 12345)


@pytest.fixture
def repo(fake_hub: FakeHub, q4: bytes) -> str:
    """A repo as quantizers publish them: several quants, a card, a projector."""
    return fake_hub.add_repo(
        REPO,
        {
            "README.md": b"# Tiny",
            "Tiny-F16.gguf": weights(20_000, 1),
            Q4: q4,
            "Tiny-Q8_0.gguf": weights(10_000, 2),
            "mmproj-Tiny-F16.gguf": weights(1000, 3),
        },
    )


def snapshot_files(cache: Path) -> list[str]:
    snapshots = cache / "models--org--Tiny-GGUF" / "snapshots"
    return sorted(p.name for p in snapshots.rglob("*") if not p.is_dir())


def leftovers(cache: Path) -> list[str]:
    blobs = cache / "models--org--Tiny-GGUF" / "blobs"
    return (
        sorted(p.name for p in blobs.iterdir() if ".kvscope." in p.name) if blobs.exists() else []
    )


def test_a_pull_lands_in_the_hf_cache_where_huggingface_hub_finds_it(
    fake_hub: FakeHub, repo: str, q4: bytes, hf_cache: Path
) -> None:
    seen: list[PullProgress] = []
    path = Pull(REPO, on_progress=seen.append, policy=FAST).run()
    root = hf_cache / "models--org--Tiny-GGUF"
    assert path == root / "snapshots" / repo / Q4
    assert path.read_bytes() == q4
    assert path.is_symlink() and path.resolve() == root / "blobs" / hashlib.sha256(q4).hexdigest()
    assert (root / "refs" / "main").read_text() == repo
    assert try_to_load_from_cache(REPO, Q4) == str(path)
    assert hf_hub_download(REPO, Q4, local_files_only=True) == str(path)
    assert fake_hub.bytes_served(Q4) == len(q4)
    assert leftovers(hf_cache) == []
    assert seen[0].state == "starting" and seen[-1].state == "done"
    assert seen[-1].done_bytes == seen[-1].total_bytes == len(q4)
    assert cached_ggufs() == [path]
    # huggingface_hub online sees the file as cached and fetches nothing more.
    fake_hub.reset_counts()
    assert hf_hub_download(REPO, Q4) == str(path)
    again = Pull(REPO, policy=FAST)
    assert again.run() == path
    assert fake_hub.bytes_served(Q4) == 0
    assert again.progress.state == "done" and again.progress.done_bytes == len(q4)


def test_quants_are_picked_as_llama_cpp_does(fake_hub: FakeHub, repo: str) -> None:
    assert pick_file(REPO, None, None) == [Q4]
    assert pick_file(REPO, "q8_0", None) == ["Tiny-Q8_0.gguf"]
    assert pick_file(REPO, None, "Tiny-F16.gguf") == ["Tiny-F16.gguf"]
    fake_hub.add_repo("org/Q8-only-GGUF", {"m-Q8_0.gguf": b"8", "m-F16.gguf": b"f"})
    assert pick_file("org/Q8-only-GGUF", None, None) == ["m-Q8_0.gguf"]
    with pytest.raises(PullError) as missing:
        pick_file(REPO, "Q5_K_S", None)
    assert missing.value.message == (
        f"{REPO} has no Q5_K_S quant. The quants there are: F16, Q4_K_M, Q8_0."
    )
    with pytest.raises(PullError, match="no model file nope.gguf"):
        pick_file(REPO, None, "nope.gguf")


def test_a_split_gguf_downloads_every_part(fake_hub: FakeHub, hf_cache: Path) -> None:
    parts = {f"Q4_K_M/Big-Q4_K_M-0000{i}-of-00003.gguf": weights(300_000 + i, i) for i in (1, 2, 3)}
    commit = fake_hub.add_repo("org/Big-GGUF", {**parts, "Big-Q8_0.gguf": b"q8"})
    seen: list[PullProgress] = []
    path = Pull("org/Big-GGUF", on_progress=seen.append, policy=FAST).run()
    snapshot = hf_cache / "models--org--Big-GGUF" / "snapshots" / commit
    assert path == snapshot / "Q4_K_M/Big-Q4_K_M-00001-of-00003.gguf"
    for name, data in parts.items():
        assert (snapshot / name).read_bytes() == data
    assert seen[-1].total_bytes == sum(len(d) for d in parts.values())
    assert cached_ggufs() == [path]


def test_a_dropped_connection_resumes_with_the_right_bytes(
    fake_hub: FakeHub, repo: str, q4: bytes
) -> None:
    fake_hub.set_faults(REPO, Q4, drop_after_bytes=MIB + 777, times=2)
    seen: list[PullProgress] = []
    path = Pull(REPO, on_progress=seen.append, policy=FAST).run()
    assert path.read_bytes() == q4
    # Both cut responses ended at the same offset: the bytes before it were sent once.
    assert fake_hub.bytes_served(Q4) == len(q4)
    ranges = [r.headers.get("Range") for r in fake_hub.requests if "/cdn/" in r.path]
    assert ranges == ["bytes=0-", f"bytes={MIB + 777}-", f"bytes={MIB + 777}-"]
    assert any("connection dropped" in p.note for p in seen)


def test_a_stall_is_retried_after_the_stall_timeout(
    fake_hub: FakeHub, repo: str, q4: bytes
) -> None:
    fake_hub.set_faults(REPO, Q4, stall_after_bytes=2 * MIB, stall_s=30)
    seen: list[PullProgress] = []
    began = time.monotonic()
    path = Pull(REPO, on_progress=seen.append, policy=FAST).run()
    assert time.monotonic() - began < 10
    assert path.read_bytes() == q4
    assert any(p.note.startswith("no bytes for 0.5 s") for p in seen)
    assert fake_hub.bytes_served(Q4) <= len(q4) + MIB


def test_corrupt_bytes_are_deleted_and_nothing_reaches_the_snapshot(
    fake_hub: FakeHub, repo: str, q4: bytes, hf_cache: Path
) -> None:
    fake_hub.set_faults(REPO, Q4, corrupt_at=2 * MIB + 5)
    with pytest.raises(PullError) as mismatch:
        Pull(REPO, policy=FAST).run()
    assert mismatch.value.message.startswith(f"checksum mismatch for {Q4}")
    assert "The bad bytes were deleted" in mismatch.value.message
    assert snapshot_files(hf_cache) == [] and leftovers(hf_cache) == []
    assert try_to_load_from_cache(REPO, Q4) is None and cached_ggufs() == []
    fake_hub.clear_faults()
    assert Pull(REPO, policy=FAST).run().read_bytes() == q4


def test_a_gated_repo_asks_for_the_licence_and_a_token(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch, hf_cache: Path
) -> None:
    fake_hub.add_repo("org/Gated-GGUF", {"G-Q4_K_M.gguf": b"gated weights"}, gated=True)
    with pytest.raises(PullError) as anonymous:
        Pull("org/Gated-GGUF", policy=FAST).run()
    assert "is gated (HTTP 401): no token was sent" in anonymous.value.message
    assert "Accept the licence on the model's page" in anonymous.value.message
    assert "set a token (HF_TOKEN, or `hf auth login`)" in anonymous.value.message
    monkeypatch.setenv("HF_TOKEN", "hf_user")
    with pytest.raises(PullError, match=r"\(HTTP 403\): your token \(HF_TOKEN\) has no access"):
        Pull("org/Gated-GGUF", policy=FAST).run()
    fake_hub.grant("org/Gated-GGUF", "hf_user")
    assert Pull("org/Gated-GGUF", policy=FAST).run().read_bytes() == b"gated weights"
    # The token went to the hub only, not to the CDN the hub redirected to.
    cdn = [r for r in fake_hub.requests if "/cdn/" in r.path]
    assert cdn and all("Authorization" not in r.headers for r in cdn)
    assert leftovers(hf_cache) == []


def test_a_missing_repo_or_file_is_named(
    fake_hub: FakeHub, repo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(PullError, match=r"org/Nope-GGUF was not found on http://127\.0\.0\.1"):
        Pull("org/Nope-GGUF", policy=FAST).run()
    # The file vanished between the listing and the download: the hub's 404 says so.
    fake_hub.cdn_redirect = False
    real = pull._list_repo

    def listing_with_a_ghost(name: str) -> pull._Listing:
        listing = real(name)
        ghost = pull.RemoteFile("Ghost-Q4_K_M.gguf", 10, "0" * 64, "sha256")
        return pull._Listing(name, listing.commit, {"Ghost-Q4_K_M.gguf": ghost})

    monkeypatch.setattr(pull, "_list_repo", listing_with_a_ghost)
    with pytest.raises(PullError, match=r"Ghost-Q4_K_M\.gguf is not in org/Tiny-GGUF \(HTTP 404\)"):
        Pull(REPO, policy=FAST).run()


def test_a_refused_range_starts_the_file_over(
    fake_hub: FakeHub, repo: str, q4: bytes, hf_cache: Path
) -> None:
    # A first pull leaves 1 MiB behind (a crash), then the server refuses to resume from it.
    fake_hub.set_faults(REPO, Q4, drop_after_bytes=MIB, times=5)
    with pytest.raises(PullError, match="kept failing"):
        Pull(REPO, policy=FAST).run()
    assert leftovers(hf_cache) == [
        hashlib.sha256(q4).hexdigest() + ".kvscope.incomplete",
        hashlib.sha256(q4).hexdigest() + ".kvscope.incomplete.json",
    ]
    fake_hub.set_faults(REPO, Q4, status=416)
    fake_hub.reset_counts()
    assert Pull(REPO, policy=FAST).run().read_bytes() == q4
    assert fake_hub.bytes_served(Q4) == len(q4)
    answers = [(r.headers["Range"], r.status) for r in fake_hub.requests if "/cdn/" in r.path]
    assert answers == [(f"bytes={MIB}-", 416), ("bytes=0-", 206)]


def test_a_range_refused_even_from_the_start_is_an_error(fake_hub: FakeHub, repo: str) -> None:
    fake_hub.set_faults(REPO, Q4, status=416, times=9)
    with pytest.raises(PullError, match=r"refused the byte range \(HTTP 416\)"):
        Pull(REPO, policy=FAST).run()


def test_a_full_disk_stops_at_once_and_the_rerun_resumes(
    fake_hub: FakeHub, repo: str, q4: bytes, hf_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ENOSPC simulated by the sink's write: the file system accepts 2 MiB, then is full.
    real_write = blob_sink.write_all
    written = [0]

    def write_until_full(fd: int, data: bytes | memoryview) -> None:
        if written[0] + len(data) > 2 * MIB:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(fd, data)
        written[0] += len(data)

    monkeypatch.setattr(blob_sink, "write_all", write_until_full)
    with pytest.raises(PullError) as full:
        Pull(REPO, policy=FAST).run()
    assert full.value.message.startswith(f"the disk is full ({hf_cache}): ")
    assert "run the pull again to resume" in full.value.message
    assert len(fake_hub.requests) < 10  # no retries on a full disk
    [state] = pending_partials()
    assert (state.repo, state.file, state.size) == (REPO, Q4, len(q4))
    kept = hf_cache / "models--org--Tiny-GGUF" / "blobs" / (state.etag + ".kvscope.incomplete")
    assert kept.stat().st_size == written[0] > 0
    assert snapshot_files(hf_cache) == []
    # huggingface_hub's own cache tools see an incomplete download, and no corruption.
    scan = scan_cache_dir(hf_cache)
    assert [f.file_path for f in scan.incomplete_files] == [kept] and scan.warnings == []

    monkeypatch.setattr(blob_sink, "write_all", real_write)
    fake_hub.reset_counts()
    assert Pull(REPO, policy=FAST).run().read_bytes() == q4
    assert fake_hub.bytes_served(Q4) == len(q4) - written[0]
    assert pending_partials() == []


def test_free_space_is_checked_before_the_first_byte(
    fake_hub: FakeHub, repo: str, hf_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pull.shutil, "disk_usage", lambda path: SimpleNamespace(free=MIB))
    with pytest.raises(PullError, match=r"not enough free disk space: the download needs 3\.0 MiB"):
        Pull(REPO, policy=FAST).run()
    assert fake_hub.bytes_served(Q4) == 0
    assert not (hf_cache / "models--org--Tiny-GGUF").exists()


def test_pause_resume_and_cancel_from_another_thread(
    fake_hub: FakeHub, repo: str, q4: bytes, hf_cache: Path
) -> None:
    fake_hub.set_faults(REPO, Q4, rate_bytes_per_s=2 * MIB)
    seen: list[PullProgress] = []
    job = Pull(REPO, on_progress=seen.append, policy=FAST)
    result: list[Path] = []
    errors: list[BaseException] = []
    worker = threading.Thread(target=lambda: _run_catching(job, errors, result), daemon=True)
    worker.start()
    try:
        wait_for(lambda: fake_hub.bytes_served(Q4) > MIB)
        job.pause()
        wait_for(lambda: job.progress.state == "paused")
        # The server may still push the block it had in hand into the closed socket (and only
        # then log the request): let it.
        time.sleep(0.5)
        served, asked = fake_hub.bytes_served(Q4), len(fake_hub.requests)
        time.sleep(0.4)
        assert fake_hub.bytes_served(Q4) == served  # paused: nothing read
        assert len(fake_hub.requests) == asked  # and no new request
        assert served < len(q4)
        job.resume()
        worker.join(timeout=10)
    finally:
        job.cancel()  # a failed check must not leave the worker paused for ever
    assert not errors and result[0].read_bytes() == q4
    assert [p.state for p in seen].count("paused") == 1

    fake_hub.add_repo("org/Other-GGUF", {"O-Q4_K_M.gguf": weights(3 * MIB, 9)})
    fake_hub.set_faults("org/Other-GGUF", "O-Q4_K_M.gguf", rate_bytes_per_s=4 * MIB)
    job = Pull("org/Other-GGUF", policy=FAST)
    stopped: list[BaseException] = []
    worker = threading.Thread(target=lambda: _run_catching(job, stopped, result), daemon=True)
    worker.start()
    wait_for(lambda: fake_hub.bytes_served("O-Q4_K_M.gguf") > MIB)
    job.cancel()
    worker.join(timeout=5)
    assert not worker.is_alive()
    assert len(result) == 1 and len(stopped) == 1 and isinstance(stopped[0], PullCancelled)
    assert job.progress.state == "cancelled"
    other = hf_cache / "models--org--Other-GGUF"
    assert [p for p in other.rglob("*") if not p.is_dir()] == []  # no bytes, state, or link


def test_many_pauses_in_one_download_still_finish_it(fake_hub: FakeHub, hf_cache: Path) -> None:
    # Each pause ends a read with nothing received; the sink's few buffers must all come back
    # (a lost one per pause hung the fifth resume).
    data = weights(8 * MIB, 4)
    fake_hub.add_repo("org/Paused-GGUF", {"P-Q4_K_M.gguf": data})
    fake_hub.set_faults("org/Paused-GGUF", "P-Q4_K_M.gguf", rate_bytes_per_s=8 * MIB)
    job = Pull("org/Paused-GGUF", policy=FAST)
    result: list[Path] = []
    errors: list[BaseException] = []
    worker = threading.Thread(target=lambda: _run_catching(job, errors, result), daemon=True)
    worker.start()
    try:
        for _ in range(6):
            served = fake_hub.bytes_served("P-Q4_K_M.gguf")
            wait_for(lambda s=served: fake_hub.bytes_served("P-Q4_K_M.gguf") > s + MIB // 4)
            job.pause()
            wait_for(lambda: job.progress.state == "paused")
            job.resume()
        worker.join(timeout=20)
    finally:
        job.cancel()
    assert not errors and result and result[0].read_bytes() == data


def test_two_pulls_of_one_file_do_not_share_its_partial_bytes(
    fake_hub: FakeHub, repo: str, q4: bytes
) -> None:
    fake_hub.set_faults(REPO, Q4, rate_bytes_per_s=8 * MIB)
    first = Pull(REPO, policy=FAST)
    result: list[Path] = []
    errors: list[BaseException] = []
    worker = threading.Thread(target=lambda: _run_catching(first, errors, result), daemon=True)
    worker.start()
    wait_for(lambda: fake_hub.bytes_served(Q4) > 0)
    with pytest.raises(PullError, match=f"{Q4} is being downloaded by another pull right now"):
        Pull(REPO, policy=FAST).run()
    worker.join(timeout=10)
    assert not errors and result[0].read_bytes() == q4


def test_offline_a_pulled_model_is_found_in_the_cache(
    fake_hub: FakeHub, repo: str, q4: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = Pull(REPO, policy=FAST).run()
    fake_hub.stop()
    assert Pull(REPO, policy=FAST).run() == path  # unreachable: the cached copy
    with pytest.raises(PullError, match=r"cannot reach the Hugging Face Hub .* not in the cache"):
        Pull(REPO, "Q8_0", policy=FAST).run()
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert Pull(REPO, "q4_k_m", policy=FAST).run() == path
    with pytest.raises(PullError, match=r"HF_HUB_OFFLINE is set\) and org/Tiny-GGUF:Q8_0 is not"):
        Pull(REPO, "Q8_0", policy=FAST).run()


def _run_catching(job: Pull, errors: list[BaseException], results: list[Path]) -> None:
    try:
        results.append(job.run())
    except BaseException as error:  # noqa: BLE001 - handed to the test thread
        errors.append(error)


def wait_for(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
