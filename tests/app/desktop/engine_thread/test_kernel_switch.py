"""First launch: the worker's first engine runs torch's CPU kernels while numba's compile in a
child process, then it switches to numba's at an idle moment and says so; a failed compile keeps
torch's and says that. The child is real; numba's cache is a copy of the test session's (warmed
here once), without the marker that says it is complete, so the child finds the kernels cached
and finishes in seconds instead of the ~25 s of a cold compile."""

from __future__ import annotations

import re
import shutil

import pytest
import torch
from repo_paths import REPO

from kvscope.app.core.settings import EngineSettings
from kvscope.app.desktop.engine_thread.client import EngineClient
from kvscope.engine.cpu_kernels import MARKER, NICE_ENV, compile_all, kernels_compiled, numba_dir
from kvscope.kernels import cpu_gemv

TIMEOUT_MS = 180_000  # a hang, not a speed


@pytest.fixture
def uncompiled_cache(tmp_path, monkeypatch):
    """numba's cache holding every kernel, but not yet marked complete."""
    if not cpu_gemv.installed() or cpu_gemv.load() is None:
        pytest.skip("numba's kernels do not compile here")
    if not kernels_compiled():
        compile_all(torch.get_num_threads())
    copy = tmp_path / "numba" / numba_dir().name
    shutil.copytree(numba_dir(), copy)
    (copy / MARKER).unlink()
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(copy))
    # The child at its usual nice 19 gets ~1.5% of a core while both cores run test workers:
    # CI saw it still loading the cache after the 900-token reply below had finished.
    monkeypatch.setenv(NICE_ENV, "0")
    assert not kernels_compiled()
    return copy


class Watch:
    """What a client's worker says: engines built, kernel lines, replies finished."""

    def __init__(self, client: EngineClient) -> None:
        self.layouts: list[str] = []
        self.lines: list[str] = []
        self.finished: list[str] = []
        client.engine_ready.connect(lambda info: self.layouts.append(info.weight_layout))
        client.kernel_status.connect(self.lines.append)
        client.request_output.connect(
            lambda update: self.finished.append(update.request_id) if update.finished else None
        )


@pytest.fixture
def client(qtbot, default_model_lazy, uncompiled_cache):
    made = []

    def make() -> tuple[EngineClient, Watch]:
        settings = EngineSettings(device="cpu", kv_budget_mib=32, max_model_len=1024)
        c = EngineClient(settings, loaded_model=default_model_lazy)
        made.append(c)
        watch = Watch(c)
        c.start()
        qtbot.waitUntil(lambda: bool(watch.layouts), timeout=TIMEOUT_MS)
        return c, watch

    yield make
    for c in made:
        c.shutdown()


def ask(client: EngineClient, request_id: str, max_tokens: int = 8) -> None:
    params = {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}
    client.submit(request_id, "", [{"role": "user", "content": "Hello"}], params, "stop")


def test_first_replies_on_torch_kernels_then_the_switch(qtbot, client, uncompiled_cache):
    c, watch = client()
    assert watch.layouts == ["cpu-int4"]  # built at once, nothing compiled in this process
    ask(c, "first")  # answered on torch's kernels while the child compiles
    qtbot.waitUntil(lambda: "first" in watch.finished, timeout=TIMEOUT_MS)
    qtbot.waitUntil(lambda: len(watch.layouts) == 2, timeout=TIMEOUT_MS)
    assert watch.layouts == ["cpu-int4", "cpu-gemv"]
    assert re.search(
        r"compiling in the background, about \d+ s left; replies use the slower path",
        watch.lines[0],
    ), watch.lines
    done = r"compiled in \d+ s; replies use them now \(the switch took"
    qtbot.waitUntil(lambda: bool(re.search(done, watch.lines[-1])), timeout=TIMEOUT_MS)
    assert kernels_compiled() and (uncompiled_cache / MARKER).is_file()
    ask(c, "second")  # the rebuilt engine answers
    qtbot.waitUntil(lambda: "second" in watch.finished, timeout=TIMEOUT_MS)


def test_the_switch_waits_for_the_reply_in_flight(qtbot, client):
    c, watch = client()
    ask(c, "long", max_tokens=900)  # minutes on torch's kernels: runs past the compile
    qtbot.waitUntil(
        lambda: any("when the replies in flight finish" in line for line in watch.lines),
        timeout=TIMEOUT_MS,
    )
    assert watch.layouts == ["cpu-int4"] and "long" not in watch.finished
    c.stop("long")
    qtbot.waitUntil(lambda: len(watch.layouts) == 2, timeout=TIMEOUT_MS)
    assert watch.layouts[-1] == "cpu-gemv"


def test_a_failed_compile_keeps_the_torch_kernels_and_says_so(qtbot, client, tmp_path, monkeypatch):
    broken = tmp_path / "broken" / "numba"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('numba is broken here')\n")
    monkeypatch.setenv("PYTHONPATH", str(broken.parent))  # ahead of site-packages, in the child
    c, watch = client()
    qtbot.waitUntil(
        lambda: bool(watch.lines) and "could not" in watch.lines[-1], timeout=TIMEOUT_MS
    )
    assert "numba is broken here" in watch.lines[-1]
    assert watch.lines[-1].endswith("replies keep the slower path")
    assert not kernels_compiled()
    ask(c, "after")
    qtbot.waitUntil(lambda: "after" in watch.finished, timeout=TIMEOUT_MS)
    assert watch.layouts == ["cpu-int4"]  # no switch, no rebuild


@pytest.mark.parametrize("width", [1400, 1024])
def test_the_status_bar_line_is_readable_and_keeps_the_bar_narrow(qtbot, width):
    from kvscope.app.desktop.engine_thread.kernel_switch import compiling_line
    from kvscope.app.desktop.status_bar import EngineStatusBar

    bar = EngineStatusBar()
    qtbot.addWidget(bar)
    bar.resize(width, 30)
    # The model line as the window fills it: long, elided, and as greedy for width as any label.
    bar.model_label.setText("SmolLM2-135M-Instruct.Q4_1.gguf · llama 134.5M · cpu bfloat16 " * 3)
    bar.show()
    line = compiling_line(remaining_s=21.4, elapsed_s=8.0)
    assert line.startswith("CPU kernels compiling in the background, about 21 s left")
    bar.show_kernels(line)
    qtbot.waitUntil(lambda: bar.kernel_label.isVisible())
    label = bar.kernel_label
    assert label.minimumWidth() <= 1  # room comes from the model line, never from a minimum
    assert bar.minimumSizeHint().width() <= width  # the line never widens the window

    def shown() -> str:
        width = label.contentsRect().width()
        return label.fontMetrics().elidedText(label.text(), label.elide_mode, width)

    gist = "CPU kernels compiling, about 21 s left"
    qtbot.waitUntil(lambda: shown() in (line, gist), timeout=5_000)  # whole, or its gist
    shown = shown()
    assert shown == line or width < 1400
    assert label.toolTip() == line
    bar.show_kernels("")
    assert not label.isVisible()


def test_the_compile_yields_unless_told_otherwise(monkeypatch):
    from kvscope.engine.cpu_kernels import compile_niceness

    monkeypatch.delenv(NICE_ENV, raising=False)
    assert compile_niceness() == 19
    for given, used in (("0", 0), ("7", 7), ("40", 19), ("-5", 0), ("fast", 19)):
        monkeypatch.setenv(NICE_ENV, given)
        assert compile_niceness() == used


def test_the_installed_app_runs_the_compile_itself(monkeypatch):
    """A bundle has no `python -m`: its executable takes the flag (packaging/kvscope_main.py)."""
    import sys

    from kvscope.engine.cpu_kernels import FROZEN_FLAG, compile_command

    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert compile_command(2) == [sys.executable, FROZEN_FLAG, "--threads", "2"]
    entry = REPO / "packaging" / "kvscope_main.py"
    assert f'["{FROZEN_FLAG}"]' in entry.read_text()
