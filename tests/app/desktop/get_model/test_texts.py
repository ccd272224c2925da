"""What the Get a model window writes: verdict cells, time left, progress lines."""

from kvscope.app.core.hub.pull import PullProgress
from kvscope.app.core.hub.search import FitVerdict
from kvscope.app.desktop.get_model.texts import duration, progress_line, short_tokens, verdict_cell


def verdict(fits: bool = True, runnable: bool = True) -> FitVerdict:
    return FitVerdict(fits, "cpu", 8 << 30, 1 << 30, 32768, 4096, 11, "why", runnable=runnable)


def test_a_verdict_cell_says_fits_with_context_and_chats_or_why_not() -> None:
    assert verdict_cell(verdict()) == "✓ fits · 32k tok · 11 × 4k"
    assert verdict_cell(verdict(fits=False)) == "✗ does not fit"
    assert verdict_cell(verdict(fits=False, runnable=False)) == "✗ cannot run here"
    assert [short_tokens(n) for n in (512, 4096, 23456, 131072)] == ["512", "4k", "23,456", "128k"]


def test_time_left_and_progress_read_as_a_person_says_them() -> None:
    assert [duration(s) for s in (45, 130, 7300)] == ["45 s", "2 min 10 s", "2 h 1 min"]
    running = PullProgress("o/r", "f.gguf", 12 << 20, 48 << 20, 4 << 20, 9.0, "downloading")
    assert progress_line(running) == "12.0 MiB of 48.0 MiB · 4.0 MiB/s · 9 s left"
    paused = PullProgress("o/r", "f.gguf", 12 << 20, 48 << 20, 0.0, None, "paused", "paused")
    assert progress_line(paused) == "12.0 MiB of 48.0 MiB · paused"
    retrying = PullProgress(
        "o/r", "f.gguf", 1 << 20, 48 << 20, 0.0, None, "downloading", "no bytes for 30 s"
    )
    assert progress_line(retrying) == "1.0 MiB of 48.0 MiB · … (no bytes for 30 s)"
