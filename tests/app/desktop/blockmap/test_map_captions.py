"""The captions over the block maps show every line: a sliding-window model's groups line was cut
off under the grid, since the caption was a fixed three lines high and wrapped to five."""

from __future__ import annotations

import pytest
from tiny_gemma3 import make_tiny_gemma3_gguf

from kvscope.app.desktop.blockmap import BlockMapPanel
from kvscope.engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def sliding_engine(tmp_path_factory):
    """The tiny Gemma 3 (one full and six sliding KV groups) with a reply under way, after
    two finished ones: blocks held by both kinds, some released."""
    path = make_tiny_gemma3_gguf(tmp_path_factory.mktemp("gemma") / "gemma.gguf", seed=1)
    llm = LLM(model=str(path), device="cpu", dtype="float32", num_kv_blocks=600)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    llm.generate(["hello world " * 20, "hi there " * 30], params)
    llm.engine.add_request("r1", "some text " * 20, SamplingParams(max_tokens=200, ignore_eos=True))
    for _ in range(30):
        llm.engine.step()
    return llm


@pytest.mark.parametrize("width", [520, 760, 1100])
def test_every_caption_line_shows_above_the_grid(qtbot, sliding_engine, width):
    llm = sliding_engine
    panel = BlockMapPanel()
    qtbot.addWidget(panel)
    panel.resize(width, 600)
    panel.show()
    panel.update_view(llm.engine.kv_snapshot(), llm.engine.shadow_snapshot(), llm.stats(), None)
    frames = (panel.paged_frame, panel.shadow_frame)

    def laid_out() -> bool:  # the layout runs from the event loop after a caption grows
        return all(f.caption.geometry().bottom() < f.map.geometry().top() for f in frames)

    qtbot.waitUntil(laid_out, timeout=5_000)
    for frame in frames:
        caption, grid = frame.caption, frame.map
        # The text needs this much at the caption's width; all of it is inside the label.
        needed = caption.heightForWidth(caption.width())
        assert caption.height() >= needed, (width, caption.height(), needed, caption.text())
        assert caption.geometry().bottom() < grid.geometry().top() and grid.height() > 50
    assert "sliding (8-token window) blocks held" in panel.paged_frame.caption.text()
    # Never shorter than three lines, so the grid does not jump as figures change length.
    caption = panel.paged_frame.caption
    caption.setText("Paged pool")
    assert caption.height() >= 3 * caption.fontMetrics().lineSpacing()
