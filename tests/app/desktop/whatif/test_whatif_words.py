"""The What-if tab says in words what its figures could be misread as (issue 44): prefix hits
that rise as the pool shrinks are re-reads after preemption (and first admissions that came
after the shared prefix was computed), and a step end with nothing
running and requests waiting is no stall (the next step admits them)."""

from __future__ import annotations

import pytest
from sliding_models import make_sliding_model

from kvscope.app.desktop.whatif import WhatIfPanel
from kvscope.app.desktop.whatif import summary as words
from kvscope.app.desktop.whatif.side import BETWEEN_STEPS_TIP, TIPS
from kvscope.engine import EngineConfig, LLMEngine, SamplingParams
from kvscope.engine.whatif import WhatIf, simulate

TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """16 chats behind a shared system prompt, on a pool that holds them all at once."""
    model = make_sliding_model("qwen2", tmp_path_factory.mktemp("words") / "m", 24, 5)
    engine = LLMEngine(
        EngineConfig(
            model=str(model),
            device="cpu",
            dtype="float32",
            block_size=16,
            num_kv_blocks=160,
            max_model_len=160,
            max_num_seqs=16,
        )
    )
    system = [(7 * i) % 500 + 2 for i in range(70)]
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    for i in range(16):
        engine.add_request(f"c{i}", system + [(13 * i + j) % 500 + 2 for j in range(12)], greedy)
    while engine.has_unfinished_requests():
        engine.step()
    return engine.trace.trace()


def test_hits_that_rise_with_a_smaller_pool_are_counted_as_re_reads(trace):
    recorded = simulate(trace).summary
    small = simulate(trace, WhatIf(num_blocks=40)).summary
    assert recorded.preemptions == 0 and recorded.recompute_hit_tokens == 0
    assert small.preemptions > 0 and small.prefix_hit_tokens > recorded.prefix_hit_tokens
    # The rise: re-reads, and first admissions that came after the shared prefix was computed
    # (admitted together, in the step that computes it, requests cannot share it).
    more = small.prefix_hit_tokens - small.recompute_hit_tokens - recorded.prefix_hit_tokens
    assert more > 0
    line = words.hits_line(recorded, small)
    assert line.startswith(
        f"{small.recompute_hit_tokens:,} of the {small.prefix_hit_tokens:,} prefix-hit tokens "
        "are re-reads after preemption"
    )
    assert f"; {more:,} more are first admissions that came later than recorded" in line
    assert words.hits_line(recorded, recorded) == ""
    table = words.figures_html(recorded, small)
    assert "of which re-reads after preemption" in table
    assert "of which re-reads" not in words.figures_html(recorded, recorded)


def test_a_step_end_with_nothing_running_says_the_next_step_admits(trace):
    result = simulate(trace, WhatIf(max_num_seqs=4, prefix_caching=False))
    idle = [i for i, s in enumerate(result.steps) if s.running == 0 and s.waiting > 0]
    assert idle  # 4 at a time, all to the same length: each four end in the same step
    for i in idle:  # ... and the next step admits the waiting ones: no stall
        after = result.steps[i + 1]
        assert after.prefill_seqs > 0 and after.running > 0
    first = result.steps[idle[0]]
    line = words.idle_line(result)
    assert line.startswith(f"{len(idle)} steps (the first: step {first.step}, ")
    assert "nothing stalls" in line
    assert words.idle_line(simulate(trace)) == ""


def test_the_panel_says_both(qtbot, trace):
    panel = WhatIfPanel()
    qtbot.addWidget(panel)
    panel.resize(760, 780)
    panel.show()
    panel.set_trace(trace)
    qtbot.waitUntil(lambda: panel.result is not None, timeout=TIMEOUT_MS)
    try:
        panel.controls.max_seqs.setValue(4)
        panel.controls.prefix.setChecked(False)
        qtbot.waitUntil(
            lambda: (
                panel.result is not None
                and panel.what == WhatIf(max_num_seqs=4, prefix_caching=False)
            ),
            timeout=TIMEOUT_MS,
        )
        assert "nothing stalls" in panel.headline.text()
        result = panel.result
        idle = next(s for s in result.steps if s.running == 0 and s.waiting > 0)
        panel.timeline.set_time(idle.time + idle.duration)
        side = panel.whatif_side
        assert side.step_at(idle.time + idle.duration) == idle
        assert side.figures["running"].toolTip() == BETWEEN_STEPS_TIP
        panel.timeline.set_time(0.0)
        assert side.figures["running"].toolTip() == TIPS["running"]
    finally:
        panel.shutdown()
