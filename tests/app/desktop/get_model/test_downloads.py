"""The Get a model window's downloads: progress to a verified file in the HF cache, pause that
stops the bytes, resume, cancel that deletes the partial, two at once, a gated repo in words,
and a download an earlier session left part-way, resumed for only its missing bytes."""

import hashlib
from pathlib import Path

from fake_hub import FakeHub
from huggingface_hub import try_to_load_from_cache

from kvscope.app.core.hub.cache_layout import PARTIAL_SUFFIX
from kvscope.app.core.hub.search import HubFile

MIB = 1 << 20
REPO = "org/Slow-GGUF"


def weights(size: int, seed: int = 0) -> bytes:
    """Bytes that differ at every offset, so a byte from the wrong place is noticed."""
    return hashlib.shake_256(f"weights {seed}".encode()).digest(size)


def publish(hub: FakeHub, sizes: dict[str, int], rate: float) -> list[HubFile]:
    """Files of these sizes (bytes seeded by their order) in REPO, sent at `rate` bytes/s."""
    data = {name: weights(size, seed) for seed, (name, size) in enumerate(sizes.items())}
    hub.add_repo(REPO, data)
    for name in data:
        hub.set_faults(REPO, name, rate_bytes_per_s=rate)
    return [
        HubFile(REPO, name, [name], None, len(body), hashlib.sha256(body).hexdigest())
        for name, body in data.items()
    ]


def settled_count(count, qtbot, quiet_ms: int = 300, timeout_ms: int = 5_000) -> int:  # type: ignore[no-untyped-def]
    """`count()` once it has not changed for `quiet_ms`: a server thread the machine's load
    kept from counting its last write gets to do so first."""
    last, waited = count(), 0
    while waited < timeout_ms:
        qtbot.wait(quiet_ms)
        waited += quiet_ms
        now = count()
        if now == last:
            return int(now)
        last = now
    raise AssertionError(f"the count was still changing after {timeout_ms} ms: {last}")


def partials(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.rglob(f"*{PARTIAL_SUFFIX}*"))


def test_a_download_shows_progress_and_ends_verified_in_the_hf_cache(
    get_model_window, fake_hub: FakeHub, hf_cache: Path, qtbot
) -> None:
    [hub_file] = publish(fake_hub, {"Slow-Q4_K_M.gguf": 4 * MIB}, rate=6 * MIB)
    row = get_model_window.download(hub_file)
    seen: list[tuple[int, str]] = []
    row.task.progressed.connect(lambda p: seen.append((p.done_bytes, row.detail.text())))
    qtbot.waitUntil(lambda: row.state == "done", timeout=15_000)
    done_bytes = [d for d, _ in seen]
    assert len(set(done_bytes)) >= 3 and done_bytes == sorted(done_bytes)
    assert any("MiB/s" in text and "left" in text for _, text in seen)
    assert row.bar.value() == row.bar.maximum()
    assert row.open_button.isVisible() and not row.pause_button.isVisible()
    assert row.path == try_to_load_from_cache(REPO, hub_file.file)
    assert Path(row.path).read_bytes() == weights(4 * MIB)
    assert fake_hub.bytes_served(hub_file.file) == 4 * MIB
    assert partials(hf_cache) == []


def test_pause_stops_the_bytes_and_resume_finishes_the_file(
    get_model_window, fake_hub: FakeHub, qtbot
) -> None:
    [hub_file] = publish(fake_hub, {"Slow-Q4_K_M.gguf": 6 * MIB}, rate=4 * MIB)
    row = get_model_window.download(hub_file)
    notes: list[str] = []
    row.task.progressed.connect(lambda p: notes.append(p.note))
    qtbot.waitUntil(lambda: fake_hub.bytes_served(hub_file.file) >= MIB, timeout=10_000)
    row.pause_button.click()
    assert row.state == "paused" and row.resume_button.isVisible()
    # The download thread says "paused" once it has left the stream and closed the socket; on a
    # loaded machine that can be a second after the click, and until then the server may still
    # fill the socket buffers. What lands after it is the block in flight, at most.
    qtbot.waitUntil(lambda: "paused" in notes, timeout=10_000)
    stopped_at = settled_count(lambda: fake_hub.bytes_served(hub_file.file), qtbot)
    qtbot.wait(700)
    assert fake_hub.bytes_served(hub_file.file) == stopped_at < 6 * MIB
    assert "paused" in row.detail.text()
    row.resume_button.click()
    qtbot.waitUntil(lambda: row.state == "done", timeout=15_000)
    assert Path(row.path).read_bytes() == weights(6 * MIB)
    # Only what had not arrived is sent again (at most the one block in flight at the pause).
    assert fake_hub.bytes_served(hub_file.file) <= 7 * MIB


def test_cancel_stops_the_download_and_removes_the_partial(
    get_model_window, fake_hub: FakeHub, hf_cache: Path, qtbot
) -> None:
    [hub_file] = publish(fake_hub, {"Slow-Q4_K_M.gguf": 6 * MIB}, rate=3 * MIB)
    row = get_model_window.download(hub_file)
    qtbot.waitUntil(lambda: partials(hf_cache) != [] and row.bar.value() > 0, timeout=10_000)
    row.cancel_button.click()
    qtbot.waitUntil(lambda: row.state == "cancelled", timeout=10_000)
    assert partials(hf_cache) == []
    assert try_to_load_from_cache(REPO, hub_file.file) is None
    assert row.remove_button.isVisible() and not row.cancel_button.isVisible()
    row.remove_button.click()
    assert get_model_window.downloads.rows() == []


def test_two_downloads_run_at_once(get_model_window, fake_hub: FakeHub, qtbot) -> None:
    sizes = {"Slow-Q4_K_M.gguf": 3 * MIB, "Slow-Q8_0.gguf": 3 * MIB}
    first, second = publish(fake_hub, sizes, rate=3 * MIB)
    rows = [get_model_window.download(first), get_model_window.download(second)]
    assert get_model_window.download(first) is rows[0]  # one download per file

    def both_under_way() -> bool:
        served = [fake_hub.bytes_served(f.file) for f in (first, second)]
        shown = [row.state for row in rows] == ["downloading", "downloading"]
        return shown and all(0 < n < 3 * MIB for n in served)

    qtbot.waitUntil(both_under_way, timeout=10_000)
    qtbot.waitUntil(lambda: [row.state for row in rows] == ["done", "done"], timeout=15_000)
    assert Path(rows[0].path).read_bytes() == weights(3 * MIB, 0)
    assert Path(rows[1].path).read_bytes() == weights(3 * MIB, 1)


def test_a_gated_repo_fails_in_words(get_model_window, fake_hub: FakeHub, qtbot) -> None:
    fake_hub.add_repo("meta/Gated-GGUF", {"Gated-Q4_K_M.gguf": weights(1000)}, gated=True)
    name = "Gated-Q4_K_M.gguf"
    hub_file = HubFile("meta/Gated-GGUF", name, [name], None, 1000, None)
    row = get_model_window.download(hub_file)
    qtbot.waitUntil(lambda: row.state == "failed", timeout=10_000)
    assert row.error.isVisible()
    assert "meta/Gated-GGUF is gated" in row.error.text()
    assert "Accept the licence on the model's page" in row.error.text()
    assert "HF_TOKEN" in row.error.text()
    assert row.retry_button.isVisible() and not row.open_button.isVisible()


def test_a_download_left_part_way_is_offered_at_the_next_start_and_fetches_only_the_rest(
    get_model_window, fake_hub: FakeHub, qtbot
) -> None:
    from kvscope.app.desktop.get_model.window import GetModelWindow

    [hub_file] = publish(fake_hub, {"Slow-Q4_K_M.gguf": 4 * MIB}, rate=4 * MIB)
    row = get_model_window.download(hub_file)
    qtbot.waitUntil(lambda: row.bar.value() > 0, timeout=10_000)
    row.pause_button.click()
    # The file vanishes from the hub mid-download: the pull ends, its verified bytes stay.
    fake_hub.set_faults(REPO, hub_file.file, status=404)
    row.resume_button.click()
    qtbot.waitUntil(lambda: row.state == "failed", timeout=10_000)
    assert f"HTTP 404 for {REPO}/{hub_file.file}" in row.error.text()
    sent_before = fake_hub.bytes_served(hub_file.file)
    later = GetModelWindow()  # the app's next start
    qtbot.addWidget(later)
    later.show()
    [stopped] = later.downloads.rows()
    assert stopped.state == "stopped" and stopped.resume_button.isVisible()
    assert "stopped when the app last closed" in stopped.detail.text()
    stopped.resume_button.click()
    qtbot.waitUntil(lambda: stopped.state == "done", timeout=15_000)
    assert Path(stopped.path).read_bytes() == weights(4 * MIB)
    resent = fake_hub.bytes_served(hub_file.file) - sent_before
    assert 0 < resent < 4 * MIB
    later.shutdown()
