"""The what-if simulator against the real engine (issue 30's honesty checks).

Replaying a trace under its own settings reproduces the recorded run step by step (blocks held,
cached, running, waiting, preemptions, prefix hits); under other settings (half the pool, block
size 32, prefix caching off, the contiguous allocator, sliding windows not honoured, fewer
sequences) its allocation figures equal a real engine run of the same requests under those
settings. Greedy with ignore_eos, so both runs produce the same number of tokens whatever their
values; the model is a tiny random Qwen2 whose layers form two KV groups (one full, one sliding),
and the bundled model for a session recorded to a file.
"""

from __future__ import annotations

import gc
import weakref

import pytest
from sliding_models import make_sliding_model

from kvscope.engine import EngineConfig, LLMEngine, SamplingParams
from kvscope.engine.kv.replay import replay_events
from kvscope.engine.trace import Trace, read_trace
from kvscope.engine.whatif import PoolSeeker, WhatIf, recorded_summary, simulate
from kvscope.engine.whatif.sim_engine import SimEngine

WINDOW = 24
# 48 blocks of 16 tokens for one layer (each KV group holds one of the two layers): the pool is
# bytes, so a layout of other blocks (32 tokens, one group of both layers) gets fewer of them.
POOL = 48 * 2 * 16 * 2 * 16 * 4
BASE = dict(block_size=16, kv_cache_memory=POOL, max_num_seqs=8, max_model_len=160)
ALLOCATION = ("steps", "preemptions", "peak_running", "peak_blocks_used", "waited", "rejected")


def _work() -> list[tuple[list[int], SamplingParams]]:
    """Shared prefixes (prefix hits), n=2 (forks, copy-on-write), lengths that overrun windows."""
    prefix = [(7 * i) % 500 + 2 for i in range(40)]
    work = []
    for i in range(10):
        prompt = (
            prefix + [(13 * i + j) % 500 + 2 for j in range(5 + 6 * i)]
            if i % 2
            else [(11 * i + 3 * j) % 500 + 2 for j in range(20 + 4 * i)]
        )
        params = SamplingParams(
            max_tokens=12 + 5 * (i % 4), temperature=0.0, ignore_eos=True, n=2 if i in (3, 6) else 1
        )
        work.append((prompt, params))
    return work


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(make_sliding_model("qwen2", tmp_path_factory.mktemp("whatif") / "m", WINDOW, 5))


def _real_run(model: str, late: bool = False, **settings) -> tuple[Trace, int]:
    """The trace of a real run, and how many requests it refused (prompts it cannot hold)."""
    config = EngineConfig(model=model, device="cpu", dtype="float32", **{**BASE, **settings})
    engine = LLMEngine(config)
    work = _work()
    early = work[:7] if late else work
    refused = 0
    for i, (prompt, params) in enumerate(early):
        try:
            engine.add_request(f"r{i}", prompt, params)
        except ValueError:
            refused += 1
    while engine.has_unfinished_requests():
        engine.step()
        if late and engine.num_steps in (4, 9, 15):  # a second wave, mid-run (by step)
            i = len(early) + (4, 9, 15).index(engine.num_steps)
            engine.add_request(f"r{i}", *work[i])
    return engine.trace.trace(), refused


@pytest.fixture(scope="module")
def recorded(model) -> Trace:
    return _real_run(model)[0]


def test_own_settings_reproduce_the_recording_step_by_step(model):
    trace, _ = _real_run(model, late=True)
    assert trace.complete and len(trace.requests) == 10
    result = simulate(trace)
    assert result.diverged_at is None
    assert [s.counts for s in result.steps] == [s.counts for s in trace.steps]
    assert [s.shape for s in result.steps] == [s.shape for s in trace.steps]
    # Its times are the recording's too, while it follows it.
    assert [round(s.duration, 9) for s in result.steps] == [
        round(s.duration, 9) for s in trace.steps
    ]
    mine, real = result.summary, recorded_summary(trace)
    for name in (*ALLOCATION, "prefix_hit_tokens"):
        assert getattr(mine, name) == getattr(real, name), name
    assert real.prefix_hit_tokens > 0 and real.peak_running > 1
    # ... and TTFT within a microsecond (the same clock, restated from the trace's times).
    assert mine.p95_ttft_s == pytest.approx(real.p95_ttft_s, abs=1e-6)


@pytest.mark.parametrize(
    "settings, what",
    [
        (dict(kv_cache_memory=POOL // 2), WhatIf(kv_pool=POOL // 2)),
        (dict(block_size=32), WhatIf(block_size=32)),
        (dict(enable_prefix_caching=False), WhatIf(prefix_caching=False)),
        (dict(allocator="contiguous"), WhatIf(allocator="contiguous")),
        (dict(release_window_blocks=False), WhatIf(honour_windows=False)),
        (dict(max_num_seqs=3), WhatIf(max_num_seqs=3)),
        (dict(num_kv_blocks=96, max_model_len=48), WhatIf(num_blocks=96, max_model_len=48)),
        (dict(max_num_batched_tokens=64), WhatIf(max_batched_tokens=64)),
    ],
    ids=[
        "half-pool",
        "block-32",
        "no-prefix-cache",
        "contiguous",
        "windows-kept",
        "3-seqs",
        "len-48",
        "chunks-64",
    ],
)
def test_other_settings_match_a_real_run_under_them(model, recorded, settings, what):
    real, refused = _real_run(model, **settings)
    result = simulate(recorded, what)
    assert result.summary.rejected == refused
    assert result.config.num_blocks == real.settings.num_blocks
    assert [s.counts for s in result.steps] == [s.counts for s in real.steps]
    mine, theirs = result.summary, recorded_summary(real)
    for name in ALLOCATION:
        if name != "rejected":
            assert getattr(mine, name) == getattr(theirs, name), name


def test_the_settings_change_what_happens(model, recorded):
    """The comparisons above are not of runs that all look alike."""
    base = simulate(recorded).summary
    assert simulate(recorded, WhatIf(kv_pool=POOL // 2)).summary.preemptions > base.preemptions
    assert simulate(recorded, WhatIf(kv_pool=POOL * 2)).summary.preemptions == 0
    assert simulate(recorded, WhatIf(prefix_caching=False)).summary.prefix_hit_tokens == 0
    contiguous = simulate(recorded, WhatIf(allocator="contiguous")).summary
    assert contiguous.peak_running < base.peak_running and contiguous.waited > base.waited
    short = simulate(recorded, WhatIf(max_model_len=48)).summary
    assert short.rejected > 0  # prompts of 48 tokens and more cannot be held at all


def test_a_session_file_carries_the_trace_and_still_replays(default_model, tmp_path):
    """The bundled model, recorded to a file as `kvscope record` does: the KV replay reads it
    as before (passing over the trace's lines), and the trace read back replays exactly."""
    engine = LLMEngine(
        EngineConfig(device="cpu", dtype="float32", num_kv_blocks=24), loaded=default_model
    )
    path = tmp_path / "session.jsonl"
    engine.start_recording(path)
    text = "The quick brown fox jumps over the lazy dog. " * 6
    for i in range(5):
        params = SamplingParams(max_tokens=20 + 4 * i, temperature=0.0, ignore_eos=True)
        engine.add_request(f"q{i}", text + f"Question {i}: why?", params)
    while engine.has_unfinished_requests():
        engine.step()
    engine.stop_recording()
    pools = [pool.metrics for pool, _ in replay_events(path)]
    trace = read_trace(path)
    assert len(pools) == len(trace.steps) == engine.num_steps
    assert [m.blocks_used for m in pools] == [s.blocks_used for s in trace.steps]
    result = simulate(trace)
    assert result.diverged_at is None
    assert [s.counts for s in result.steps] == [s.counts for s in trace.steps]
    assert result.summary.preemptions == engine.observers.counters.num_preemptions > 0


def test_settings_that_refuse_what_the_recording_ran_go_on_by_time(model):
    """A pool too small for the first request's prompt: the recording ran it, these settings
    refuse it, and the next request (which came by step) must still arrive."""
    engine = LLMEngine(EngineConfig(model=model, device="cpu", dtype="float32", **BASE))
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    engine.add_request("long", list(range(2, 140)), greedy)
    engine.step()
    engine.add_request("short", list(range(2, 22)), greedy)
    while engine.has_unfinished_requests():
        engine.step()
    result = simulate(engine.trace.trace(), WhatIf(num_blocks=4))
    assert result.summary.rejected == 1 and result.summary.requests == 1
    assert result.diverged_at == 1


@pytest.mark.parametrize("every", [200, 5], ids=["no-checkpoint", "checkpoints"])
def test_the_seeker_matches_the_run_at_every_step_either_way(recorded, monkeypatch, every):
    monkeypatch.setattr("kvscope.engine.whatif.pool_at.CHECKPOINT_STEPS", every)
    result = simulate(recorded, WhatIf(kv_pool=POOL // 2), keep_events=True)
    seeker = PoolSeeker(result.config, result.events)
    order = list(range(1, len(result.steps) + 1))
    for step in [*order, *reversed(order), *order[::7], 3, len(order), 9, 40, 12]:
        m = seeker.at(step).metrics
        counts = result.steps[step - 1]
        assert (m.blocks_used, m.num_running, m.num_preemptions) == (
            counts.blocks_used,
            counts.running,
            counts.preemptions,
        ), step


def test_a_finished_simulation_is_freed_without_the_garbage_collector(recorded, monkeypatch):
    """The engine calls its runner, which held the engine: that cycle kept a simulation's
    whole graph (47,000 objects on a 2,461-step trace) for a full collection, which holds the
    GIL while it runs (the app runs its simulations beside the GUI thread)."""
    engines = []
    real_init = SimEngine.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        engines.append(weakref.ref(self))

    monkeypatch.setattr(SimEngine, "__init__", init)
    gc.collect()
    gc.disable()
    try:
        result = simulate(recorded, WhatIf(num_blocks=recorded.settings.num_blocks // 2))
        assert result.steps and len(engines) == 1
        assert engines[0]() is None
    finally:
        gc.enable()
