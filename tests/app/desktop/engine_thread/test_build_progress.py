"""The loading bar fills as a build reads the weights, rather than spinning with no end."""

from __future__ import annotations

import torch

from kvscope.app.desktop.engine_thread.weights_progress import CountedWeights
from kvscope.app.desktop.status_bar import PROGRESS_STEPS
from kvscope.engine.model.weight_source import TensorDictSource


def test_the_share_follows_the_elements_read_not_the_tensor_count():
    source = TensorDictSource({"big": torch.zeros(90, 10), "norm": torch.zeros(100)})
    shares: list[float] = []
    counted = CountedWeights(source, shares.append)
    counted.read("norm", "auto", torch.float32)
    assert shares == [0.1]  # 100 of 1,000 elements, though it is one tensor of two
    counted.read("big", "auto", torch.float32)
    assert shares == [0.1, 1.0]
    assert counted.shapes() == source.shapes()


def test_a_rebuild_fills_the_status_bar(make_window, qtbot):
    window = make_window()
    shares: list[float] = []
    window.client.build_progress.connect(shares.append)
    bar = window.status.busy_bar
    # The bar as the rebuilt engine arrives (the window's own signal, on the GUI thread, after
    # the build's queued progress): a later build (the switch to numba's kernels when their
    # compile ends) may start its own stage after it.
    at_ready: list[tuple[int, int]] = []
    window.engine_ready.connect(lambda _info: at_ready.append((bar.maximum(), bar.value())))
    window.apply_settings(window.settings.with_engine(block_size=32))
    qtbot.waitUntil(lambda: bool(at_ready), timeout=120_000)
    assert at_ready[0] == (PROGRESS_STEPS, PROGRESS_STEPS)  # determinate, and full
    assert len(set(shares)) >= 10 and max(shares) == 1.0, shares
