"""Fixtures for the Get a model window's tests (the fake_hub fixture is tests/conftest.py's):
GGUF bytes small enough to serve and load at once, and a window whose threads are stopped after
each test."""

from collections.abc import Iterator

import pytest
from fake_hub import FakeHub
from tiny_models import make_quant_gguf, make_tiny_gguf

from kvscope.app.core.hub.http_range import RetryPolicy

FAST = RetryPolicy(stall_timeout_s=1.0, retry_base_s=0.01, retry_cap_s=0.05, max_failures=3)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A whole tiny Llama GGUF (2 layers, a byte vocabulary: ~0.4 MiB) the engine loads fast."""
    path, _ = make_tiny_gguf("llama", tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return path.read_bytes()


@pytest.fixture(scope="session")
def q4_gguf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A tiny GGUF whose matrices are Q4_K (~0.7 MiB), as quantizers publish."""
    return make_quant_gguf(tmp_path_factory.mktemp("gguf") / "q4.gguf", "Q4_K").read_bytes()


@pytest.fixture
def get_model_window(qtbot, fake_hub: FakeHub) -> Iterator:
    """A GetModelWindow at 1024x700 on the fake hub, retries quick; shut down afterwards."""
    from kvscope.app.desktop.get_model.window import GetModelWindow

    window = GetModelWindow(policy=FAST)
    qtbot.addWidget(window)
    window.resize(1024, 700)
    window.show()
    yield window
    window.shutdown()
    for row in window.downloads.rows():
        row.task.cancel()
        row.task.wait(5)
