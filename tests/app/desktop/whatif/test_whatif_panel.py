"""The What-if tab (issue 30): a real engine's trace replayed on the panel under other settings.

The trace is a tiny random Qwen2's (tests/sliding_models.py: a full layer and a sliding one),
run on a pool twice the one test_whatif_replay uses, so that its recording never preempts and
half of it does. The window's own tests run the bundled model: the worker's trace after a chat,
and Apply rebuilding the engine on the what-if's knobs.
"""

from __future__ import annotations

import math
import threading
import time
from types import SimpleNamespace

import pytest
from PySide6.QtWidgets import QTabBar
from sliding_models import make_sliding_model

from kvscope.app.core.settings import AppSettings, EngineSettings
from kvscope.app.desktop.palette import DARK, LIGHT
from kvscope.app.desktop.theme import theme_keeper
from kvscope.app.desktop.whatif import WhatIfPanel, jobs, knobs
from kvscope.app.desktop.whatif import runner as runner_module
from kvscope.app.desktop.whatif.apply import plan_apply
from kvscope.app.desktop.whatif.panel import EMPTY_TEXT
from kvscope.app.desktop.whatif.runner import SimRunner, Superseded
from kvscope.app.desktop.whatif.timeline import POSITIONS
from kvscope.engine import EngineConfig, LLMEngine, SamplingParams
from kvscope.engine.whatif import PoolSeeker, WhatIf, recorded_config, resolve, simulate

POOL = 2 * 48 * 2 * 16 * 2 * 16 * 4  # 96 blocks of 16 tokens for one layer (a KV group)
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """A real run: shared prefixes, n=2 forks, a second wave mid-run; no preemption."""
    model = make_sliding_model("qwen2", tmp_path_factory.mktemp("whatif-panel") / "m", 24, 5)
    config = EngineConfig(
        model=str(model),
        device="cpu",
        dtype="float32",
        block_size=16,
        kv_cache_memory=POOL,
        max_num_seqs=8,
        max_model_len=160,
    )
    engine = LLMEngine(config)
    prefix = [(7 * i) % 500 + 2 for i in range(40)]
    for i in range(10):
        prompt = (
            prefix + [(13 * i + j) % 500 + 2 for j in range(5 + 6 * i)]
            if i % 2
            else [(11 * i + 3 * j) % 500 + 2 for j in range(20 + 4 * i)]
        )
        n = 2 if i in (3, 6) else 1
        params = SamplingParams(max_tokens=12 + 5 * (i % 4), temperature=0.0, ignore_eos=True, n=n)
        engine.add_request(f"r{i}", prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
    return engine.trace.trace()


class WatchedEvent(threading.Event):
    """An Event that keeps every set (True) and clear (False) it was given."""

    def __init__(self) -> None:
        super().__init__()
        super().set()
        self.states: list[bool] = []

    def set(self) -> None:
        self.states.append(True)
        super().set()

    def clear(self) -> None:
        self.states.append(False)
        super().clear()


def cpu_settings() -> AppSettings:
    return AppSettings(engine=EngineSettings(device="cpu", kv_budget_mib=8))


@pytest.fixture()
def panel(qtbot, trace):
    panel = WhatIfPanel(cpu_settings)
    qtbot.addWidget(panel)
    panel.resize(760, 780)
    panel.show()
    panel.set_trace(trace)
    qtbot.waitUntil(lambda: panel.result is not None, timeout=TIMEOUT_MS)
    yield panel
    panel.shutdown()


def wait_for_pool(qtbot, panel, pool: int) -> None:
    qtbot.waitUntil(
        lambda: panel.result is not None and panel.what.kv_pool == pool, timeout=TIMEOUT_MS
    )


def test_half_the_pool_preempts_where_the_recording_did_not(panel, qtbot, trace):
    assert trace.complete and panel.stack.currentIndex() == 1
    assert "Identical to the recording" in panel.headline.text()
    assert panel.recorded_figures.preemptions == 0 == panel.result.summary.preemptions
    recorded_pool = panel.recorded.config.pool_bytes
    assert recorded_pool == POOL
    panel.controls.pool_spin.setValue(POOL / 2 / knobs.MIB)  # as a user types it
    wait_for_pool(qtbot, panel, POOL // 2)
    mine = panel.result.summary
    assert mine.preemptions > panel.recorded_figures.preemptions
    assert mine == simulate(trace, WhatIf(kv_pool=POOL // 2)).summary
    assert "Diverges from the recording at step" in panel.headline.text()
    assert f"{mine.preemptions} preemptions (recorded 0)" in panel.headline.text()
    assert "pool 192 KiB" in panel.whatif_side.caption.text()
    assert "48 blocks" in panel.whatif_side.caption.text()
    assert "96 blocks" in panel.recorded_side.caption.text()
    assert panel.controls.pool_note.text() == "= 48 blocks"
    # The honour-windows box is live: this model has a sliding layer.
    assert panel.controls.windows.isEnabled() and panel.controls.windows.isChecked()


def test_scrubbing_shows_both_runs_at_the_same_time(panel, qtbot):
    panel.controls.set_pool_bytes(POOL // 2)
    wait_for_pool(qtbot, panel, POOL // 2)
    sides = (panel.recorded_side, panel.whatif_side)
    runs = (panel.recorded, panel.result)
    seekers = [PoolSeeker(r.config, r.events) for r in runs]
    ends = [[s.time + s.duration for s in r.steps] for r in runs]
    assert panel.timeline.duration == pytest.approx(max(e[-1] for e in ends))
    seen = set()
    for position in (0, 1500, 4000, 6500, 8000, POSITIONS):
        panel.timeline.slider.setValue(position)  # as a drag does
        t = panel.timeline.time
        assert t == pytest.approx(panel.timeline.duration * position / POSITIONS)
        shown = []
        for side, run, seeker, run_ends in zip(sides, runs, seekers, ends, strict=True):
            index = max((i for i, end in enumerate(run_ends) if end <= t), default=-1)
            step = run.steps[index].step if index >= 0 else 0
            assert side.shown_step == step, (position, side.recorded)
            assert side.map.snapshot.equals(seeker.at(step))
            blocks = run.steps[index].blocks_used if index >= 0 else 0
            assert side.figures["blocks_used"].value.text() == f"{blocks:,}"
            shown.append(step)
        seen.add(tuple(shown))
        assert all(c.value() == pytest.approx(t) for c in panel.plots.cursors)
    # The runs take different times: at some moments they are at different steps.
    assert any(a != b for a, b in seen)
    assert shown == [len(runs[0].steps), len(runs[1].steps)]
    # Play moves the time on from the start.
    panel.timeline.set_time(0.0)
    panel.timeline.speed.setCurrentIndex(0)
    panel.timeline.toggle_play()
    qtbot.waitUntil(lambda: panel.timeline.time > 0, timeout=5_000)
    panel.timeline.pause()
    assert not panel.timeline.playing


def test_a_pool_sweep_plots_each_value_and_marks_the_setting(panel, qtbot, trace):
    panel.controls.set_pool_bytes(POOL // 2)
    wait_for_pool(qtbot, panel, POOL // 2)
    panel.tabs.setCurrentWidget(panel.sweep_view)
    panel.sweep_view.knob.setCurrentIndex(panel.sweep_view.knob.findData("kv_pool"))
    panel.sweep_view.run.click()
    qtbot.waitUntil(lambda: bool(panel.sweep_view.points), timeout=TIMEOUT_MS)
    view = panel.sweep_view
    values = knobs.sweep_values("kv_pool", trace.settings, panel.recorded.config)
    assert 8 <= len(view.points) == len(values) <= 20
    assert [p.what.kv_pool for p in view.points] == values
    assert all(p.what.rate_scale == 1.0 and p.summary is not None for p in view.points)
    preemptions = [p.summary.preemptions for p in view.points]
    assert preemptions[0] > 0 == preemptions[-1]  # a small pool preempts, a big one not
    xs, ys = view.curves[0].getData()
    # In log mode pyqtgraph hands back the log10 of x.
    assert list(ys) == preemptions
    assert [10**x for x in xs] == pytest.approx([v / knobs.MIB for v in values])
    assert all(m.isVisible() for m in view.markers)
    assert view.markers[0].value() == pytest.approx(math.log10(POOL / 2 / knobs.MIB))
    # One point, checked against the simulator itself.
    third = view.points[3]
    assert third.summary == simulate(trace, WhatIf(kv_pool=values[3])).summary
    # Another setting moves the mark.
    panel.controls.set_pool_bytes(POOL)
    wait_for_pool(qtbot, panel, None)
    assert view.markers[0].value() == pytest.approx(math.log10(POOL / knobs.MIB))


def test_a_pool_that_holds_no_block_says_why_and_the_panel_goes_on(panel, qtbot):
    panel.controls.set_pool_bytes(100)
    qtbot.waitUntil(lambda: panel.error_label.isVisible(), timeout=TIMEOUT_MS)
    assert "holds no block" in panel.error_label.text() and "100" in panel.error_label.text()
    assert panel.error == panel.error_label.text()
    assert panel.result is None and not panel.apply.isEnabled()
    assert "Cannot apply" in panel.apply.toolTip()
    panel.controls.set_pool_bytes(POOL // 2)
    wait_for_pool(qtbot, panel, POOL // 2)
    assert not panel.error_label.isVisible() and panel.error == ""
    assert panel.result.summary.preemptions > 0


def test_another_kv_dtype_says_its_cost_is_not_in_the_step_times(panel, qtbot):
    assert "own cost" not in panel.headline.text()
    panel.controls.kv_dtype.setCurrentIndex(panel.controls.kv_dtype.findData("fp8"))
    qtbot.waitUntil(
        lambda: panel.result is not None and panel.what.kv_dtype == "fp8", timeout=TIMEOUT_MS
    )
    assert "the fp8 cache&#x27;s own cost is not in them" in panel.headline.text()


def test_the_panel_follows_the_theme(panel):
    keeper = theme_keeper()
    before = keeper.choice
    try:
        keeper.apply("light")
        assert LIGHT.ground in panel.styleSheet()
        keeper.apply("dark")
        assert DARK.ground in panel.styleSheet()
    finally:
        keeper.apply(before)


def test_no_traffic_yet_is_the_empty_state(qtbot, trace):
    panel = WhatIfPanel(cpu_settings)
    qtbot.addWidget(panel)
    empty = trace.__class__(trace.settings, (), {}, (), 0)
    panel.set_trace(empty)
    assert panel.stack.currentIndex() == 0 and panel.empty_text.text() == EMPTY_TEXT
    with qtbot.waitSignal(panel.refresh_requested, timeout=1_000):
        panel.empty_refresh.click()
    panel.set_trace(trace)
    assert panel.stack.currentIndex() == 1
    panel.shutdown()


def test_a_stuck_simulation_is_given_up_and_the_next_one_runs(qtbot):
    runner = SimRunner(stuck_s=0.2)
    release = threading.Event()
    with qtbot.waitSignal(runner.finished, timeout=5_000) as stuck:
        runner.submit("whatif", lambda _job: release.wait(30))
    assert stuck.args[0].stuck and "did not finish" in stuck.args[0].error
    with qtbot.waitSignal(runner.finished, timeout=5_000) as done:
        runner.submit("whatif", lambda _job: "ran")
    assert done.args[0].result == "ran" and not done.args[0].error
    release.set()
    runner.shutdown()


def test_between_steps_is_called_before_every_step_and_can_stop_the_run(trace):
    what = WhatIf(kv_pool=POOL // 2)
    calls = []
    paced = simulate(trace, what, between_steps=lambda: calls.append(1))
    plain = simulate(trace, what)
    assert len(calls) >= len(paced.steps) > 0 and paced.summary == plain.summary

    def stop_at_ten():
        calls.append(1)
        if len(calls) > 10:
            raise Superseded

    calls.clear()
    with pytest.raises(Superseded):
        simulate(trace, what, between_steps=stop_at_ten)
    assert len(calls) == 11


def test_simulations_wait_while_the_engine_works_and_then_go_on(qtbot, trace):
    """The runner holds a what-if before its next step while the worker's idle event is
    clear (a reply generating), beating meanwhile, so it is not given up as stuck."""
    idle = threading.Event()
    runner = SimRunner(stuck_s=0.3, engine_idle=idle)
    outcomes, pauses = [], []
    runner.finished.connect(outcomes.append)
    runner.paused.connect(pauses.append)
    what = WhatIf(kv_pool=POOL // 2)
    steps = []

    def job(control):
        return simulate(
            trace, what, between_steps=lambda: (steps.append(1), control.between_steps())
        )

    runner.submit("whatif", job)
    qtbot.waitUntil(lambda: pauses == [True], timeout=5_000)
    qtbot.wait(800)  # past stuck_s: still waiting, not given up, no step simulated
    assert outcomes == [] and len(steps) == 1
    idle.set()
    qtbot.waitUntil(lambda: len(outcomes) == 1, timeout=TIMEOUT_MS)
    assert pauses == [True, False] and not outcomes[0].error
    assert outcomes[0].result.summary == simulate(trace, what).summary
    runner.shutdown()


def test_a_running_simulation_lets_the_gui_thread_in(qtbot, monkeypatch):
    """Between steps, a job that has simulated for YIELD_AFTER_S sleeps YIELD_S, so that the
    GUI thread gets the GIL (it waited for it at every Qt call while a sweep ran). The job's
    clock is the test's: a loaded machine's pauses would merge yields on a real one."""
    clock = SimpleNamespace(now=0.0, sleeps=[])

    class JobTime:
        def __getattr__(self, name):  # monotonic for the runner's watch: the real one
            return getattr(time, name)

        def perf_counter(self):
            return clock.now

        def sleep(self, seconds):
            clock.sleeps.append(seconds)

    monkeypatch.setattr(runner_module, "time", JobTime())
    runner = SimRunner()
    step_s = runner_module.YIELD_AFTER_S / 4 * 1.01  # four steps pass it, three do not

    def job(control):
        for _ in range(80):  # 20 x YIELD_AFTER_S of simulated work
            clock.now += step_s
            control.between_steps()
        return "done"

    with qtbot.waitSignal(runner.finished, timeout=5_000) as done:
        runner.submit("whatif", job)
    assert done.args[0].result == "done"
    assert clock.sleeps == [runner_module.YIELD_S] * 20
    runner.shutdown()


def test_a_waiting_simulation_superseded_never_reports(qtbot, trace):
    idle = threading.Event()
    runner = SimRunner(engine_idle=idle)
    outcomes, pauses = [], []
    runner.finished.connect(outcomes.append)
    runner.paused.connect(pauses.append)
    first = runner.submit("whatif", lambda job: simulate(trace, between_steps=job.between_steps))
    qtbot.waitUntil(lambda: pauses == [True], timeout=5_000)
    second = runner.submit("whatif", lambda job: (job.between_steps(), "second")[1])
    # The first one gives up (False: no lane waits), then the second one waits.
    qtbot.waitUntil(lambda: len(pauses) == 3, timeout=5_000)
    assert pauses == [True, False, True]
    idle.set()
    qtbot.waitUntil(lambda: len(outcomes) == 1, timeout=5_000)
    qtbot.wait(300)
    assert [(o.generation, o.result) for o in outcomes] == [(second, "second")] and first < second
    runner.shutdown()


def test_a_sweep_point_that_hangs_costs_that_point_only(panel, qtbot, monkeypatch):
    release = threading.Event()
    real_sweep = jobs.sweep
    values = knobs.sweep_values("block_size", panel.trace.settings, panel.recorded.config)

    def sweep(trace, points, cost, **kwargs):
        if points[0].block_size == values[1]:
            release.wait(30)  # this one never ends (until the test is over)
        return real_sweep(trace, points, cost, **kwargs)

    monkeypatch.setattr(jobs, "sweep", sweep)
    panel.runner.stuck_s = 0.3
    panel.run_sweep("block_size")
    qtbot.waitUntil(lambda: bool(panel.sweep_view.points), timeout=TIMEOUT_MS)
    release.set()
    points = panel.sweep_view.points
    assert [p.what.block_size for p in points] == values
    assert points[1].summary is None and "did not finish" in points[1].error
    assert all(p.summary is not None for i, p in enumerate(points) if i != 1)
    assert f"{len(values) - 1} of {len(values)} values ran" in panel.sweep_view.status.text()


def test_apply_takes_the_changed_engine_knobs_only(trace):
    current = AppSettings(engine=EngineSettings(device="cpu", kv_budget_mib=8, block_size=16))
    what = WhatIf(kv_pool=6 << 20, block_size=32, max_num_seqs=4, rate_scale=2.0)
    plan = plan_apply(what, _resolved(trace, what), trace.settings, current)
    assert plan.can_apply
    engine = plan.settings.engine
    assert (engine.kv_budget_mib, engine.block_size, engine.max_num_seqs) == (6, 32, 4)
    assert engine.enable_prefix_caching and engine.allocator == "paged"  # untouched
    assert current.engine.kv_budget_mib == 8  # the window's own settings are not changed
    assert "block_size 16 → 32" in plan.tooltip() and "kv_budget_mib 8 → 6" in plan.tooltip()
    assert any(line.startswith("rate_scale") for line in plan.left_out)
    # Under 1 MiB the app's budget cannot say it; on CUDA the pool is not set in MiB at all.
    small = WhatIf(kv_pool=POOL // 2)
    assert (
        "under 1 MiB"
        in plan_apply(small, _resolved(trace, small), trace.settings, current).tooltip()
    )
    cuda = trace.settings.__class__(**{**trace.settings.__dict__, "device": "cuda:0"})
    what = WhatIf(kv_pool=6 << 20)
    assert "on CUDA" in plan_apply(what, _resolved(trace, what), cuda, current).tooltip()
    # A knob the engine refuses disables Apply with the engine's own words.
    bad = plan_apply(
        WhatIf(max_num_seqs=-1), recorded_config(trace.settings), trace.settings, current
    )
    assert not bad.can_apply and "max_num_seqs must be >= 1" in bad.tooltip()
    same = WhatIf(block_size=16)
    assert not plan_apply(same, _resolved(trace, same), trace.settings, current).can_apply


def _resolved(trace, what):
    return resolve(trace.settings, what)


def test_the_tab_replays_the_workers_trace_and_applies_to_the_engine(make_window, qtbot):
    """Engine ▸ What if… on the real window: the worker's trace of a chat, then Apply."""
    window = make_window(max_tokens=6)
    menus = {action.text(): action.menu() for action in window.menuBar().actions()}
    assert window.whatif.action in menus["&Engine"].actions()
    assert window.map_tabs.count() == 1
    idle = window.client.worker.idle = WatchedEvent()  # what the worker says, in order
    window.whatif.action.trigger()
    panel = window.whatif.panel
    assert panel.runner.engine_idle is idle  # the tab's simulations wait on the worker's word
    # Waited for here, not with waitSignal on the worker's signal: that stops its timer from
    # the worker's thread.
    qtbot.waitUntil(lambda: panel.trace is not None, timeout=TIMEOUT_MS)
    assert window.map_tabs.count() == 2 and window.map_tabs.currentWidget() is panel
    assert window.map_tabs.tabBar().isVisible()
    assert panel.stack.currentIndex() == 0  # no traffic yet: the empty state
    with qtbot.waitSignal(window.chats.reply_finished, timeout=120_000):
        window.chats.send_message("Say hi.")
    qtbot.waitUntil(idle.is_set, timeout=5_000)
    assert False in idle.states and idle.states[-1] is True  # busy while it replied
    panel.empty_refresh.click()
    qtbot.waitUntil(lambda: panel.result is not None, timeout=TIMEOUT_MS)
    # The worker's slot hands over the live engine's trace (read here while it is idle).
    live = window.client.worker.llm.engine.trace.trace()
    assert [r.request_id for r in panel.trace.requests] == [r.request_id for r in live.requests]
    assert panel.trace.requests[0].request_id.startswith("conv-")
    assert panel.trace.steps == live.steps and len(live.steps) >= 2
    assert panel.recorded.diverged_at is None  # its own replay is the recording

    before = window.settings.engine
    assert (before.block_size, before.kv_budget_mib) == (16, 32)
    panel.controls.block_size.setCurrentIndex(panel.controls.block_size.findData(32))
    panel.controls.set_pool_bytes(16 << 20)
    wanted = WhatIf(kv_pool=16 << 20, block_size=32)
    qtbot.waitUntil(lambda: panel.what == wanted and panel.result is not None, timeout=TIMEOUT_MS)
    assert panel.apply.isEnabled(), panel.apply.toolTip()
    old_info = window.engine_info
    panel.apply.click()
    qtbot.waitUntil(lambda: window.engine_info is not old_info, timeout=120_000)
    after = window.settings.engine
    assert (after.block_size, after.kv_budget_mib) == (32, 16)
    assert after == EngineSettings(**{**before.__dict__, "block_size": 32, "kv_budget_mib": 16})
    assert window.engine_info.settings == after
    assert "Applied" in panel.apply_note.text()

    tabs = window.map_tabs
    tabs.tabBar().tabButton(tabs.indexOf(panel), QTabBar.ButtonPosition.RightSide).click()
    assert tabs.count() == 1 and window.whatif.panel is None
    assert not window.map_tabs.tabBar().isVisible()  # one tab: the bar hides again
