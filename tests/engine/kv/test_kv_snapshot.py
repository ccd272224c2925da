"""KVSnapshot and the event stream on the real engine: exact mirrors, replay, block contents."""

import json

import numpy as np
import pytest
from kv_checks import assert_telemetry_matches

from kvscope.engine import LLM, BeamSearchParams, SamplingParams
from kvscope.engine.kv.events import (
    EVENT_TYPES,
    FORMAT_VERSION,
    BlocksAllocated,
    BlocksFreed,
    EventLog,
    PrefixCacheHit,
    SequenceAdded,
    SequenceAdmitted,
    SequenceFinished,
    SequenceForked,
    StepProgress,
    read_events,
)
from kvscope.engine.kv.replay import replay_events
from kvscope.engine.kv.snapshot import BlockState, free_runs
from kvscope.engine.kv.telemetry import PoolTelemetry

SYSTEM = "You are a careful assistant who answers in one short sentence. " * 3


def _chat(engine, request_id, question, **params):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    prompt = engine.apply_chat_template(messages)
    defaults = dict(max_tokens=12, temperature=0.0)
    engine.add_request(request_id, prompt, SamplingParams(**{**defaults, **params}))


def _run(engine, on_step=None):
    while engine.has_unfinished_requests():
        engine.step()
        engine.allocator.check_invariants()
        assert_telemetry_matches(engine.observers.telemetry, engine.allocator)
        if on_step:
            on_step()


def _assert_counters_agree(snap, stats):
    """stats() and the snapshot report the same traffic counters: one owner for each."""
    m = snap.metrics
    assert m.num_preemptions == stats["num_preemptions"]
    assert m.prefix_query_tokens == stats["prefix_cache_query_tokens"]
    assert m.prefix_hit_tokens == stats["prefix_cache_hit_tokens"]


@pytest.fixture
def small_llm(default_model):
    # Small enough that four chats with n=2 preempt each other.
    return LLM(model=default_model, device="cpu", dtype="float32", num_kv_blocks=10)


def test_snapshot_mirrors_the_pool_through_sharing_forks_and_preemption(small_llm, tmp_path):
    engine = small_llm.engine
    _chat(engine, "conv-0/1", "Name a colour.")
    engine.step()  # the system prompt is now cached for the others
    _chat(engine, "conv-1/1", "Name a fruit.", n=2, seed=3, temperature=0.8)
    _chat(engine, "conv-2/1", "Name a planet.")
    _chat(engine, "conv-3/1", "Name a river.", max_tokens=40)
    seen_shared = seen_preempted = False

    def check():
        nonlocal seen_shared, seen_preempted
        snap = engine.kv_snapshot()
        stats = engine.stats()
        m = snap.metrics
        assert m.blocks_used == stats["kv_blocks_used"]
        assert m.blocks_cached == stats["kv_blocks_cached"]
        assert m.blocks_used + m.blocks_free == stats["kv_blocks_total"]
        assert m.tokens_stored == stats["kv_tokens_stored"] <= m.slots_held
        assert m.num_running == stats["num_running"]
        _assert_counters_agree(snap, stats)
        # Only a sequence's last block may be partly filled.
        for info in snap.sequences:
            if info.status == "running" and info.block_table:
                fills = snap.filled[list(info.block_table)]
                assert (fills[:-1] == snap.block_size).all()
        seen_shared |= m.blocks_shared > 0
        seen_preempted |= m.num_preempted > 0

    _run(engine, check)
    assert seen_shared and seen_preempted and engine.stats()["num_preemptions"] > 0
    final = small_llm.kv_snapshot()
    assert final.metrics.blocks_used == 0
    assert final.metrics.blocks_cached > 0  # the shared system prompt stays reusable
    assert (final.state[final.has_hash] == BlockState.CACHED).all()


def test_stats_and_snapshot_count_beam_search_and_preemption_alike(small_llm):
    llm = small_llm
    prompt = llm.engine.tokenize(
        llm.engine.apply_chat_template([{"role": "user", "content": SYSTEM}])
    )[1]
    params = BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True)
    llm.beam_search([prompt], params)
    stats = llm.stats()
    _assert_counters_agree(llm.kv_snapshot(), stats)
    assert stats["prefix_cache_query_tokens"] == len(prompt)
    assert stats["num_steps"] == 3 and stats["num_running"] == 0
    llm.beam_search([prompt], params)  # the first search left the prompt's blocks cached
    stats = llm.stats()
    _assert_counters_agree(llm.kv_snapshot(), stats)
    assert stats["prefix_cache_query_tokens"] == 2 * len(prompt)
    assert stats["prefix_cache_hit_tokens"] == (len(prompt) - 1) // 16 * 16 > 0
    questions = ["Name a colour.", "Name a fruit.", "Name a planet.", "Name a river."]
    chats = [[{"role": "user", "content": SYSTEM + q}] for q in questions]
    llm.chat(chats, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    stats = llm.stats()
    assert stats["num_preemptions"] > 0
    _assert_counters_agree(llm.kv_snapshot(), stats)


def test_a_recorded_session_replays_into_the_same_snapshots(small_llm, tmp_path):
    engine = small_llm.engine
    _chat(engine, "warm/1", "Say hi.")  # leaves cached blocks before the recording starts
    _run(engine)
    path = tmp_path / "session.jsonl"
    engine.start_recording(path)
    _chat(engine, "conv-0/1", "Name a colour.", n=2, seed=1, temperature=0.9)
    _chat(engine, "conv-1/1", "Name a river.", max_tokens=30)
    live = []
    _run(engine, lambda: live.append((engine.kv_snapshot(), engine.shadow_snapshot())))
    engine.stop_recording()
    replayed = list(replay_events(path, with_shadow=True))
    assert len(replayed) == len(live) > 5
    for (pool, shadow), (pool_r, shadow_r) in zip(live, replayed, strict=True):
        assert pool.equals(pool_r)
        assert shadow.equals(shadow_r)
    header, events = read_events(path)
    assert header["kvscope_events"] == FORMAT_VERSION
    kinds = {type(e) for e in events}
    assert {
        SequenceAdded,
        SequenceAdmitted,
        BlocksAllocated,
        PrefixCacheHit,
        SequenceForked,
        BlocksFreed,
        SequenceFinished,
        StepProgress,
    } <= kinds


def test_recording_needs_an_idle_engine(small_llm, tmp_path):
    engine = small_llm.engine
    _chat(engine, "busy/1", "Hello")
    with pytest.raises(ValueError, match="idle engine"):
        engine.start_recording(tmp_path / "x.jsonl")
    engine.abort_request("busy/1")


def test_block_contents_gives_the_tokens_and_text_a_block_holds(small_llm):
    engine = small_llm.engine
    _chat(engine, "conv-0/1", "Name a colour.", max_tokens=30)
    engine.step()
    snap = engine.kv_snapshot()
    (info,) = [s for s in snap.sequences if s.request_id == "conv-0/1"]
    first = engine.block_contents(info.block_table[0])
    assert first["owners"] == ["conv-0/1"] and first["state"] == "used"
    assert first["logical_index"] == 0 and first["ref_count"] == 1
    seq_tokens = engine.requests["conv-0/1"].sequences[0].token_ids
    assert first["token_ids"] == seq_tokens[: engine.config.block_size]
    assert "system" in first["text"]
    last = engine.block_contents(info.block_table[-1])
    assert len(last["token_ids"]) == snap.filled[info.block_table[-1]]
    engine.abort_request("conv-0/1")
    cached = engine.block_contents(info.block_table[0])
    assert cached["state"] == "cached" and cached["token_ids"] == first["token_ids"]
    with pytest.raises(ValueError, match="outside the pool"):
        engine.block_contents(engine.allocator.num_blocks)


def test_the_event_log_is_bounded_but_counts_everything():
    log = EventLog(capacity=3)
    for i in range(5):
        log.step = i
        log.emit(StepProgress, lens=((i, 1, 1),))
    assert len(log.recent()) == 3 and log.total == 5
    last = log.recent(1)[0]
    assert isinstance(last, StepProgress) and last.lens == ((4, 1, 1),) and last.step == 4
    with pytest.raises(ValueError, match="capacity"):
        EventLog(capacity=0)


def test_free_runs_counts_holes_and_the_largest_run():
    state = np.array([0, 0, 1, 2, 0, 1, 3, 0], dtype=np.uint8)
    assert free_runs(state) == (2, 3)  # free or cached: [0,1], [3,4], [7]
    assert free_runs(np.ones(4, dtype=np.uint8)) == (0, 0)


def test_reading_a_bad_event_file_names_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_events(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"something": 1}\n')
    with pytest.raises(ValueError, match="not a KVScope event file"):
        read_events(bad)
    bad.write_text('{"kvscope_events": 1, "num_blocks": 4}\n')
    with pytest.raises(ValueError, match="format version 1.*reads version 2"):
        read_events(bad)


GOOD_EVENT = {"kind": "blocks_allocated", "step": 1, "time": 2.5, "seq_id": 0, "blocks": [1, 2]}


@pytest.mark.parametrize(
    "event,problem",
    [
        ({**GOOD_EVENT, "kind": "alloc"}, "unknown KV event kind 'alloc'"),
        (GOOD_EVENT, r"lacks fields \['start'\]"),
        ({**GOOD_EVENT, "start": 0, "data": {}}, r"unknown fields \['data'\]"),
        ({**GOOD_EVENT, "start": "0"}, "blocks_allocated.start must be an int >= 0, got '0'"),
        ({**GOOD_EVENT, "start": True}, "start must be an int"),
        ({**GOOD_EVENT, "start": 0, "blocks": [1, -2]}, "blocks must be an int >= 0, got -2"),
        ({**GOOD_EVENT, "start": 0, "blocks": 3}, "blocks must be a list"),
        ({"kind": "step_progress", "step": 1, "time": 1, "lens": [[0, 1]]}, "lens must be a list"),
        ([1, 2], "an event is a JSON object"),
    ],
)
def test_a_bad_event_line_is_named_with_its_problem(tmp_path, event, problem):
    path = tmp_path / "session.jsonl"
    good = {**GOOD_EVENT, "start": 0}
    lines = [{"kvscope_events": FORMAT_VERSION}, good, event]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    header, events = read_events(path)
    assert next(events) == BlocksAllocated(1, 2.5, 0, (1, 2), 0)
    with pytest.raises(ValueError, match=f"session.jsonl:3: .*{problem}"):
        next(events)


def test_an_event_that_does_not_follow_is_a_value_error(tmp_path):
    path = tmp_path / "session.jsonl"
    header = {"kvscope_events": FORMAT_VERSION, "num_blocks": 4, "block_size": 2}
    freed = {"kind": "blocks_freed", "step": 1, "time": 1.0, "seq_id": 7, "blocks": [9]}
    path.write_text(json.dumps({**header, "allocator": "paged"}) + "\n" + json.dumps(freed))
    with pytest.raises(ValueError, match="event 1 \\(blocks_freed\\) does not follow"):
        next(replay_events(path))
    path.write_text(json.dumps({**header, "allocator": "paged", "counters": {"state": 1}}))
    with pytest.raises(ValueError, match="header counters"):
        next(replay_events(path))
    path.write_text(json.dumps({**header, "allocator": "buddy"}))
    with pytest.raises(ValueError, match="header allocator 'buddy'"):
        next(replay_events(path))


def test_the_telemetry_handles_every_event_kind():
    tel = PoolTelemetry(4, 2)
    assert set(tel._HANDLERS) == set(EVENT_TYPES.values())


def test_record_and_replay_from_the_command_line(tmp_path, capsys):
    from kvscope.app.cli.main import main

    path = tmp_path / "events.jsonl"
    args = ["record", str(path), "--num-requests", "2", "--max-tokens-cap", "3"]
    assert main([*args, "--num-kv-blocks", "32", "--dtype", "float32"]) == 0
    assert "recorded" in capsys.readouterr().out
    assert main(["replay", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("step") and len(lines) >= 4
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
