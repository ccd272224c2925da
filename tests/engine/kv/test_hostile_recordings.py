"""Hostile recording files: every malformed one is the format's ValueError naming the file and
the line, sizes are checked before anything is allocated, frees against what a sequence holds.

Real recordings (a tiny two-group Qwen2 on a tight pool: forks, prefix hits, window releases,
preemption, eviction; and the contiguous allocator) replay exactly under the checks, and a
hypothesis fuzzer mutating them only ever gets a replay or a ValueError.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sliding_models import make_sliding_model

from kvscope.engine import SamplingParams
from kvscope.engine.config import EngineConfig
from kvscope.engine.kv import replay as replay_module
from kvscope.engine.kv.events import FORMAT_VERSION, read_events
from kvscope.engine.kv.replay import replay_events
from kvscope.engine.llm_engine import LLMEngine

PROMPT = list(range(5, 45))
HEADER = {
    "kvscope_events": FORMAT_VERSION,
    "num_blocks": 8,
    "block_size": 4,
    "allocator": "paged",
    "max_seq_len": 32,
    "model": "m",
}


def ev(kind: str, **fields) -> dict:
    return {"kind": kind, "step": 1, "time": 1.0, **fields}


ADD = ev("sequence_added", seq_id=0, request_id="r", sample=0, num_prompt_tokens=4)
ADD_1 = {**ADD, "seq_id": 1, "request_id": "q"}
ALLOC = ev("blocks_allocated", seq_id=0, blocks=[1], start=0, group=0)
FREE = ev("blocks_freed", seq_id=0, blocks=[1], group=0, start=0)
STEP = ev("step_progress", lens=[[0, 4, 4]])


def write(path: Path, *lines: dict | str) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def replay_all(path: Path) -> int:
    return len(list(replay_events(path, with_shadow=True)))


# ---- each case the issue names -----------------------------------------------------------------
@pytest.mark.parametrize(
    "lines, problem",
    [
        # A 100k-deep JSON list was a RecursionError out of json.loads.
        (["[" * 100_000 + "]" * 100_000], r"hostile.jsonl:2: JSON nested too deeply"),
        ([ADD, {**ALLOC, "blocks": [{"a": [[[[[[[[1]]]]]]]]}]}], r":3: .*blocks must be an int"),
        # 10^30 did not fit numpy's int64: OverflowError.
        ([ADD, {**ALLOC, "blocks": [10**30]}], r":3: .*blocks is 1000.*above the format's limit"),
        ([ADD, {**ALLOC, "blocks": [10**18]}], r":3: event 2 .*block 10+ is outside .* 8 blocks"),
        # Group 200 overflowed the int8 group array: OverflowError.
        ([ADD, {**ALLOC, "group": 200}], r":3: event 2 .*group 200 is not below .* 1 groups"),
        # A start of 10^9 padded a table with a billion entries (or overflowed int32).
        (
            [ADD, ev("prefix_cache_hit", seq_id=0, blocks=[1], group=0, start=10**9)],
            r":3: event 2 .*table entry 1,000,000,001; .* at most 9",
        ),
        ([ADD, {**ALLOC, "start": 3}], r"start 3, but sequence 0's group 0 table has 0 entries"),
        # Freed twice, or by a sequence that never held the block: accepted silently before.
        ([ADD, ALLOC, FREE, FREE], r":5: event 4 \(blocks_freed\) does not follow.*freed twice"),
        ([ADD, ADD_1, ALLOC, {**FREE, "seq_id": 1}], r":5: event 4 .* does not follow"),
        ([ADD, ALLOC, {**FREE, "blocks": [2]}], r"sequence 0 frees \[2\] .* holds \[1\] there"),
        ([ADD, ADD_1, ALLOC, {**ALLOC, "seq_id": 1}], r"event 4 .*block 1 is not free \(used, 1"),
        ([ADD, ALLOC, ALLOC], r"event 3 .*start 0, but .* table has 1 entries"),
        ([ADD, {**ALLOC, "blocks": [2, 2]}], r"lists a block twice"),
        ([ev("block_evicted", block=3)], r"block 3 is evicted but not cached \(free"),
        ([ADD, ADD], r"sequence 0 was added already"),
        ([FREE], r"sequence 0 was never added"),
        (
            [ADD, ev("sequence_admitted", seq_id=0, query_tokens=1, hit_tokens=5, first=True)],
            r"hit_tokens 5 exceeds query_tokens 1",
        ),
        ([ADD, ev("blocks_released", seq_id=0, blocks=[1], start=0, group=0)], r"releases \[1\]"),
        ([ADD, ev("blocks_hashed", seq_id=0, blocks=[4])], r"block 4 is hashed but nobody holds"),
        (["\xff"], r"hostile.jsonl:2: "),
    ],
)
def test_a_malformed_event_is_a_value_error_naming_the_line(tmp_path, lines, problem):
    path = write(tmp_path / "hostile.jsonl", HEADER, *lines)
    with pytest.raises(ValueError, match=problem):
        replay_all(path)


def test_bytes_that_are_not_utf8_name_the_line(tmp_path):
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(json.dumps(HEADER).encode() + b"\n" + json.dumps(ADD).encode() + b"\n\xff\n")
    with pytest.raises(ValueError, match=r"hostile.jsonl:3: not UTF-8 text \(byte 0\)"):
        replay_all(path)


@pytest.mark.parametrize(
    "override, problem",
    [
        ({"num_blocks": 1 << 26}, r"header num_blocks 67108864 is not in \[1, 16,777,216\]"),
        ({"max_seq_len": 10**12}, r"header max_seq_len 1000000000000 is not in"),
        ({"group_windows": [None, 10**20]}, r"header group_windows"),
        ({"cached_blocks": [1, 1]}, r"distinct block ids below 8"),
        ({"allocator": [[[[[[[[]]]]]]]]}, r"header allocator \[\[\[.*\]\] is not one of"),
        ({"counters": {"num_preemptions": 1 << 64}}, r"header counters"),
        ({"kvscope_events": [[[[[[[[[]]]]]]]]]}, r"event format version \[\[\["),
    ],
)
def test_a_header_is_checked_before_anything_is_sized_by_it(tmp_path, override, problem):
    path = write(tmp_path / "header.jsonl", {**HEADER, **override}, STEP)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=problem):
            replay_all(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # 2^26 blocks took 6.6 GB before numpy's MemoryError; nothing is sized by a refused header.
    assert peak < 32 << 20


def test_a_pool_too_big_for_this_machines_memory_is_refused(tmp_path, monkeypatch):
    path = write(tmp_path / "big.jsonl", {**HEADER, "num_blocks": 1 << 18, "max_seq_len": 64}, STEP)
    monkeypatch.setattr(replay_module, "system_memory", lambda: (8 << 30, 10 << 20))
    with pytest.raises(ValueError, match=r"num_blocks 262,144: .* 50 MiB.* 10 MiB available"):
        replay_all(path)
    monkeypatch.setattr(replay_module, "system_memory", lambda: (8 << 30, 1 << 30))
    assert replay_all(path) == 1  # the same file where the memory is there


def test_a_line_longer_than_the_cap_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    from kvscope.engine.kv import session_json

    monkeypatch.setattr(session_json, "MAX_LINE_BYTES", 1000)
    path = write(tmp_path / "long.jsonl", HEADER, {**STEP, "lens": [[0, 4, 4]] * 200})
    with pytest.raises(ValueError, match=r"long.jsonl:2: line is longer than"):
        replay_all(path)


def test_table_padding_is_bounded_across_sequences(tmp_path, monkeypatch):
    from kvscope.engine.kv import replay_checks

    monkeypatch.setattr(replay_checks, "MIN_TABLE_ENTRIES", 100)
    hits = []
    for seq in range(10):
        hits.append({**ADD, "seq_id": seq, "request_id": f"r{seq}"})
        hits.append(ev("prefix_cache_hit", seq_id=seq, blocks=[1], group=0, start=30))
    header = {**HEADER, "max_seq_len": 4 * 40, "cached_blocks": [1]}
    path = write(tmp_path / "pad.jsonl", header, *hits)
    with pytest.raises(ValueError, match=r"event 8 .*tables would hold over 100 entries"):
        replay_all(path)


def test_the_cli_prints_the_error_and_exits_2(tmp_path, capsys):
    from kvscope.app.cli.main import main

    path = write(tmp_path / "twice.jsonl", HEADER, ADD, ALLOC, STEP, FREE, FREE)
    assert main(["replay", str(path)]) == 2
    captured = capsys.readouterr()
    assert "twice.jsonl:6: event 5 (blocks_freed) does not follow" in captured.err
    assert "Traceback" not in captured.err
    deep = write(tmp_path / "deep.jsonl", HEADER, "[" * 100_000)
    assert main(["replay", str(deep)]) == 2
    assert "deep.jsonl:2: JSON nested too deeply" in capsys.readouterr().err


# ---- real recordings replay under the checks; mutated ones fail only with ValueError ---------
@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> dict[str, Path]:
    """A paged session with every kind of traffic, and a contiguous one."""
    folder = tmp_path_factory.mktemp("rec")
    model = make_sliding_model("qwen2", folder / "qwen2", 24, seed=4)
    paths = {}
    for allocator, blocks in (("paged", 26), ("contiguous", 24)):
        engine = LLMEngine(
            EngineConfig(
                model=str(model),
                device="cpu",
                dtype="float32",
                block_size=8,
                num_kv_blocks=blocks,
                allocator=allocator,
                max_model_len=96,
            )
        )
        path = folder / f"{allocator}.jsonl"
        engine.start_recording(path)
        greedy = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
        engine.add_request("a", PROMPT, greedy)
        if allocator == "paged":
            engine.add_request("b", PROMPT[:20], SamplingParams(max_tokens=30, n=2, seed=1))
        engine.add_request("c", PROMPT[:36], greedy)
        live = []
        while engine.has_unfinished_requests():
            engine.step()
            live.append(engine.kv_snapshot())
        engine.stop_recording()
        replayed = [pool for pool, _ in replay_events(path, with_shadow=True)]
        assert len(replayed) == len(live)
        assert all(a.equals(b) for a, b in zip(live, replayed, strict=True))
        paths[allocator] = path
    return paths


def test_real_recordings_hold_every_kind_of_traffic(recordings):
    _, events = read_events(recordings["paged"])
    kinds = {e.kind for e in events}
    expected = {"sequence_forked", "prefix_cache_hit", "blocks_released", "sequence_preempted"}
    assert expected | {"block_evicted", "blocks_freed"} <= kinds, kinds
    _, events = read_events(recordings["contiguous"])
    assert {"blocks_reserved", "blocks_allocated", "blocks_freed"} <= {e.kind for e in events}


HUGE = [10**30, 1 << 63, (1 << 63) - 1, 10**7, -1, -(10**30), 0.5, 1e308, True, False, None, "7"]


@st.composite
def mutations(draw):
    """(which recording, a function turning its lines into hostile ones)."""
    which = draw(st.sampled_from(["paged", "contiguous"]))
    how = draw(st.sampled_from(["number", "flip", "truncate", "nest", "drop", "swap", "dup"]))
    index = draw(st.integers(0, 10**6))
    value = draw(st.one_of(st.sampled_from(HUGE), st.integers(-5, 40)))
    seed = draw(st.integers(0, 10**6))
    return which, (how, index, value, seed)


def mutate(lines: list[str], how: str, index: int, value, seed: int) -> list[str]:
    i = index % len(lines)
    line = lines[i]
    if how == "number":  # one number in the line becomes huge, negative, a float, a bool...
        record = json.loads(line)
        slots = _number_slots(record)
        if slots:
            container, key = slots[seed % len(slots)]
            container[key] = value
        line = json.dumps(record)
    elif how == "flip":
        data = bytearray(line.encode())
        data[seed % len(data)] ^= 1 << (seed % 8)
        line = data.decode("utf-8", errors="surrogateescape")
    elif how == "truncate":
        line = line[: seed % len(line)]
    elif how == "nest":
        depth = [5, 900, 5000, 100_000][seed % 4]
        line = line.replace('"blocks":', '"blocks":' + "[" * depth, 1) + "]" * depth
    elif how == "drop":
        return lines[:i] + lines[i + 1 :]
    elif how == "swap":
        j = seed % len(lines)
        lines = list(lines)
        lines[i], lines[j] = lines[j], lines[i]
        return lines
    elif how == "dup":
        return lines[: i + 1] + [line] + lines[i + 1 :]
    return lines[:i] + [line] + lines[i + 1 :]


def _number_slots(node, slots=None):
    slots = [] if slots is None else slots
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, v in items:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            slots.append((node, key))
        elif isinstance(v, (dict, list)):
            _number_slots(v, slots)
    return slots


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=mutations())
def test_a_mutated_recording_replays_or_raises_value_error(recordings, tmp_path, case):
    which, (how, index, value, seed) = case
    lines = recordings[which].read_text().splitlines()
    path = tmp_path / "mutated.jsonl"
    data = "\n".join(mutate(lines, how, index, value, seed)) + "\n"
    path.write_bytes(data.encode("utf-8", errors="surrogateescape"))
    try:
        replay_all(path)
    except ValueError as e:
        assert str(path) in str(e) and len(str(e)) < 2000
