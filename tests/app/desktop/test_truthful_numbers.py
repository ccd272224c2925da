"""Issue 14: the map's and the status bar's numbers agree with the engine and mean something.

Real engines on the bundled model (tiny pools, a few steps) make the snapshots and stats that
the real widgets are fed, as the worker would feed them.
"""

from __future__ import annotations

import math

import pytest
from hand_snapshots import Seq, make_snapshot

from kvscope.app.desktop.blockmap.glossary import TERMS
from kvscope.app.desktop.blockmap.pool_fit import naive_sequences, naive_warning
from kvscope.app.desktop.blockmap.traffic import TrafficCounter
from kvscope.app.desktop.simulated_users.loadgen import (
    PROMPT_SLACK,
    TEMPLATE_TOKENS,
    LoadGenerator,
    LoadSpec,
    describe_progress,
    fit_to_context,
    preemption_demo,
)


def make_llm(default_model, **knobs):
    from kvscope.engine import LLM

    return LLM(model=default_model, device="cpu", dtype="float32", **knobs)


def submit(llm, request_id: str, text: str, max_tokens: int = 4) -> None:
    from kvscope.engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm.engine.add_request(request_id, text, params)


def load_requests(llm, spec: LoadSpec, until_s: float = 5.0) -> LoadGenerator:
    """Every user's first request, submitted as the worker would; each must be accepted."""
    gen = LoadGenerator(spec)
    t = 0.0
    while t <= until_s and len(gen.in_flight) < spec.num_users:
        for request in gen.due(t):
            prompt = llm.engine.apply_chat_template(list(request.messages))
            llm.engine.add_request(request.request_id, prompt, request.params)
        t += 0.25
    return gen


def engine_info(llm):
    from kvscope.app.core.engine_messages import EngineInfo
    from kvscope.app.core.settings import EngineSettings

    return EngineInfo.of(llm, EngineSettings(device="cpu", dtype="float32"))


# ---- item 2: defaults that make the comparison meaningful ----------------------------------


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
def test_the_default_pool_holds_several_full_contexts(kv_dtype):
    from kvscope.app.core.settings import AppSettings
    from kvscope.engine.sizing import planner

    es = AppSettings().engine
    mc = planner.model_config(None)
    blocks = planner.predict_num_blocks(mc, es.block_size, kv_dtype, es.kv_budget_mib << 20)
    assert blocks * es.block_size / es.max_model_len >= 4
    assert naive_sequences(blocks, es.block_size, es.max_model_len) >= 4
    assert naive_warning(blocks, es.block_size, es.max_model_len) == ""


def test_the_issue_s_pool_warns_everywhere(qtbot, default_model):
    """364 blocks at the model's own 8,192: one naive reservation takes the whole pool."""
    from dataclasses import replace

    from kvscope.app.core.settings import AppSettings, EngineSettings
    from kvscope.app.desktop.blockmap import BlockMapPanel
    from kvscope.app.desktop.settings.dialog import SettingsDialog
    from kvscope.app.desktop.status_bar import EngineStatusBar

    warning = naive_warning(364, 16, 8192)
    assert "364 of 364 blocks" in warning and "1 sequence at a time" in warning
    assert "1,456" in warning  # a context the pool holds four times

    llm = make_llm(default_model, num_kv_blocks=16, max_model_len=2048)  # 256 tokens
    bar = EngineStatusBar()
    qtbot.addWidget(bar)
    info = engine_info(llm)
    bar.show_engine(info)
    assert not bar.warning_label.isHidden() and "naive allocator" in bar.warning_label.toolTip()
    bar.show_engine(replace(info, num_blocks=728, max_model_len=2048))
    assert bar.warning_label.isHidden()

    panel = BlockMapPanel()
    qtbot.addWidget(panel)
    panel.update_view(llm.engine.kv_snapshot(), llm.engine.shadow_snapshot(), llm.stats(), None)
    assert not panel.banner.isHidden() and "16 of 16 blocks" in panel.banner.text()
    roomy = {**llm.stats(), "max_model_len": 64}  # four reservations of 4 blocks fit
    panel.update_view(llm.engine.kv_snapshot(), llm.engine.shadow_snapshot(), roomy, None)
    assert panel.banner.isHidden()

    engine = EngineSettings(device="cpu", dtype="float32", kv_budget_mib=256, max_model_len=8192)
    dialog = SettingsDialog(AppSettings(engine=engine))
    qtbot.addWidget(dialog)
    prediction = dialog.picker.prediction.text()
    assert "0.7 full contexts" in prediction and "⚠" in prediction and "364 of 364" in prediction
    dialog.max_len.setValue(1024)
    prediction = dialog.picker.prediction.text()
    assert "⚠" not in prediction and "5 full-length sequences side by side" in prediction


# ---- item 3: numbers that agree ----------------------------------------------------------


def test_tokens_per_second_never_reads_zero_between_slow_steps():
    """Steps of 3 s (a slow CPU), telemetry every 0.5 s: the rate stays near 4 tokens/s."""
    counter = TrafficCounter()
    rates = []
    for tick in range(80):  # 40 s
        now = tick * 0.5
        step = int(now // 3)  # one step every 3 s; 2 sequences, one token each per step
        seqs = [
            Seq(1, "load-1/0", (0, 1), 20 + step, num_prompt_tokens=20),
            Seq(2, "load-2/0", (2, 3), 20 + step, num_prompt_tokens=20),
        ]
        if tick == 0 or now % 3 == 0:
            snap = make_snapshot(8, seqs, step=step)
        counter.update(now, snap, {})
        if now >= 3:
            rates.append(counter.tokens_per_s)
    assert min(rates) > 0
    assert rates[-1] == pytest.approx(2 / 3, rel=0.35)
    assert counter.rate_window >= 12  # four steps of 3 s

    idle = make_snapshot(8, [], step=99)
    counter.update(41.0, idle, {})
    for tick in range(5):
        counter.update(42.0 + tick * 20, idle, {})
    assert counter.tokens_per_s == 0.0  # nothing runs: the rate falls to 0


def test_contiguous_engine_tiles_and_status_bar_agree(qtbot, default_model):
    from kvscope.app.desktop.blockmap import BlockMapPanel
    from kvscope.app.desktop.status_bar import EngineStatusBar

    llm = make_llm(default_model, num_kv_blocks=24, max_model_len=128, allocator="contiguous")
    for i in range(3):
        submit(llm, f"conv-{i}/r0", f"Say something about the number {i}.")
    llm.engine.step()
    stats, snapshot = llm.stats(), llm.engine.kv_snapshot()
    assert llm.engine.shadow_snapshot() is None and snapshot.metrics.blocks_reserved > 0

    panel = BlockMapPanel()
    qtbot.addWidget(panel)
    panel.update_view(snapshot, None, stats, None)
    strip = panel.strip.text()
    held = stats["kv_blocks_used"]
    assert held == 3 * 8  # three reservations of 128 tokens
    assert f"{held} of 24 blocks (contiguous)" in strip
    assert "contiguous wastes" in strip and "paged" not in strip
    bar = EngineStatusBar()
    qtbot.addWidget(bar)
    bar.show_pool(stats)
    assert f"KV {held}/24 blocks held" in bar.pool_label.text()


def test_an_empty_pool_shows_no_share_and_no_holes(qtbot, default_model):
    from kvscope.app.desktop.blockmap import BlockMapPanel

    llm = make_llm(default_model, num_kv_blocks=20, max_model_len=64)
    panel = BlockMapPanel()
    qtbot.addWidget(panel)
    panel.update_view(llm.engine.kv_snapshot(), llm.engine.shadow_snapshot(), llm.stats(), None)
    assert "USEFUL SLOTS: — vs —" in panel.strip.text()
    assert "nothing held" in panel.strip.text()
    caption = panel.shadow_frame.caption.text()
    assert "all 20 blocks free, no holes" in caption and "useful —" in caption
    assert "holes)" not in caption
    x, y = panel.plots.series("paged_useful")
    assert math.isnan(y[-1])  # a gap in the plot, not a 100% line


def test_the_memory_plot_starts_at_zero(qtbot):
    from kvscope.app.desktop.blockmap.time_plots import TimePlots

    plots = TimePlots()
    qtbot.addWidget(plots)
    for i in range(40):
        plots.add_sample(i * 0.5, {"mem_process": 1.5 + 1e-4 * (i % 2), "tokens_per_s": 3.0})
    plots.redraw()
    memory = plots.plots[5].viewRange()[1]
    assert memory[0] == 0 and memory[1] >= 1.5  # a 0.0001 GiB wobble stays a flat line
    rate = plots.plots[3].viewRange()[1]
    assert rate[0] == 0 and rate[1] >= 3.0


def test_load_progress_and_status_bar_tell_running_from_waiting(qtbot, default_model):
    from kvscope.app.desktop.status_bar import EngineStatusBar

    llm = make_llm(default_model, num_kv_blocks=64, max_model_len=256, max_num_seqs=3)
    spec = LoadSpec(
        num_users=8, prompt_tokens=(20, 30), output_tokens=(4, 4), arrival_rate_per_s=99
    )
    gen = load_requests(llm, spec)
    llm.engine.step()
    snapshot, stats = llm.engine.kv_snapshot(), llm.stats()
    pairs = [(s.request_id, s.status) for s in snapshot.sequences]
    assert describe_progress(list(gen.in_flight), pairs) == "8 submitted: 3 running, 5 waiting"
    # A request sent since the engine's last step is not counted as waiting: the Sequences tile
    # and the status bar say 5 waiting, and so does the panel (the issue: "1 waiting" vs 0).
    line = describe_progress([*gen.in_flight, "sent-just-now"], pairs)
    assert line == "9 submitted: 3 running, 5 waiting, 1 not in the engine yet"
    assert stats["num_waiting"] == 5

    bar = EngineStatusBar()
    qtbot.addWidget(bar)
    bar.show_state(engine_loaded=True, replies_in_flight=0)
    assert bar.state_label.text() == "Ready"
    bar.show_pool(stats)  # only simulated users run: not "Ready"
    assert bar.state_label.text() == "Serving requests · 3 running, 5 waiting"
    bar.show_state(engine_loaded=True, replies_in_flight=1)
    assert bar.state_label.text().startswith("Generating 1 reply · 3 running")
    bar.show_state(engine_loaded=True, replies_in_flight=0)
    bar.show_pool({**stats, "num_running": 0, "num_waiting": 0})
    assert bar.state_label.text() == "Ready"


# ---- item 4: the load generator within the engine's limits --------------------------------


def test_default_load_fits_a_512_token_context(default_model):
    fitted = fit_to_context(LoadSpec(), 512)
    worst = fitted.prompt_tokens[1] * PROMPT_SLACK + TEMPLATE_TOKENS + fitted.output_tokens[1]
    assert worst <= 512 and fitted.prompt_tokens[0] >= 16
    llm = make_llm(default_model, num_kv_blocks=40, max_model_len=512)
    spec = fit_to_context(LoadSpec(num_users=12, arrival_rate_per_s=99.0), 512)
    gen = load_requests(llm, spec)
    assert len(gen.in_flight) == 12  # no prompt is refused
    for request_id in list(llm.engine.requests):
        llm.engine.abort_request(request_id)


def test_default_load_unfitted_would_be_refused(default_model):
    """The issue's symptom, kept as a guard: the old 256-768 range overruns 512 tokens."""
    llm = make_llm(default_model, num_kv_blocks=40, max_model_len=512)
    with pytest.raises(ValueError, match="max_model_len"):
        load_requests(llm, LoadSpec(num_users=12, prompt_tokens=(700, 768), arrival_rate_per_s=99))


def test_the_preemption_preset_preempts_on_a_small_pool(qtbot, default_model):
    from kvscope.app.desktop.simulated_users.panel import LoadGeneratorPanel

    llm = make_llm(default_model, num_kv_blocks=8, max_model_len=128)
    panel = LoadGeneratorPanel()
    qtbot.addWidget(panel)
    assert not panel.preset.isEnabled()  # no engine yet: nothing to size it to
    panel.set_engine_info(engine_info(llm))
    assert panel.prompt.high.maximum() == llm.engine.max_seq_len
    panel.preset.click()
    spec = panel.spec()
    assert spec == preemption_demo(8, 16, llm.engine.max_seq_len, 64)

    load_requests(llm, spec)
    for _ in range(60):
        llm.engine.step()
        if llm.stats()["num_preemptions"]:
            break
    assert llm.stats()["num_preemptions"] > 0


# ---- item 9: shared blocks and the terms, explained ---------------------------------------


def test_a_shared_system_prompt_block_names_its_chats(qtbot, default_model):
    from kvscope.app.desktop.blockmap import BlockMapPanel
    from kvscope.engine.kv.snapshot import BlockState

    llm = make_llm(default_model, num_kv_blocks=48, max_model_len=256)
    system = "You are a careful assistant who answers in one short sentence. " * 4
    submit(llm, "conv-1/r0", system + "Why is the sky blue?")
    llm.engine.step()  # the first prompt's full blocks are hashed: the others adopt them
    submit(llm, "conv-2/r0", system + "What is a volcano?")
    submit(llm, "conv-3/r0", system + "Name a prime.")
    llm.engine.step()
    snapshot = llm.engine.kv_snapshot()
    shared = [b for b in range(snapshot.num_blocks) if snapshot.ref_count[b] == 3]
    assert shared and snapshot.state[shared[0]] == BlockState.USED

    panel = BlockMapPanel()
    qtbot.addWidget(panel)
    panel.update_view(snapshot, llm.engine.shadow_snapshot(), llm.stats(), None)
    view = panel.paged_map
    view._on_mouse_moved(view.view.mapViewToScene(view.block_center(shared[0])))
    assert "shared by 3 sequences of 3 chats" in panel.hover_text()
    chips = dict(panel.legend.groups())
    assert f"{len(shared)} shared" in chips["conv-2"]


def test_each_term_has_a_tooltip(qtbot):
    from kvscope.app.desktop.blockmap import BlockMapPanel

    panel = BlockMapPanel()
    qtbot.addWidget(panel)
    assert TERMS["useful slots"] in panel.strip.tiles["useful"].toolTip()
    shadow_tip = panel.shadow_frame.caption.toolTip()
    assert TERMS["holes"] in shadow_tip and TERMS["same traffic"] in shadow_tip
    assert TERMS["useful slots"] in panel.paged_frame.caption.toolTip()
    key_tips = [w.toolTip() for w in panel.key.findChildren(type(panel.banner))]
    assert any(TERMS["shared"] in tip for tip in key_tips)


def test_the_hover_card_is_a_window_of_its_own_inside_the_screen(qtbot):
    from hand_snapshots import small_pool

    from kvscope.app.desktop.blockmap import BlockMapPanel

    panel = BlockMapPanel()
    qtbot.addWidget(panel)
    panel.resize(700, 500)
    panel.show()
    qtbot.waitExposed(panel)
    panel.update_view(small_pool(), None, {}, None)
    view = panel.paged_map
    last = small_pool().num_blocks - 1  # bottom right: a child card would be cut by the map
    view._on_mouse_moved(view.view.mapViewToScene(view.block_center(last)))
    card = view.hover_label
    assert card.isVisible() and card.isWindow()
    screen = view.screen().availableGeometry()
    assert screen.contains(card.frameGeometry())
    view.hide()
    assert card.isHidden()
