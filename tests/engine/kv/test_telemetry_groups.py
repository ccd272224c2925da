"""A recording may declare up to 256 KV groups (engine.kv.replay): the telemetry holds every
group index it allows (issue 43: group 150 was an uncaught OverflowError for int8)."""

from __future__ import annotations

import json

from kvscope.app.cli.main import main
from kvscope.engine.kv.events import FORMAT_VERSION
from kvscope.engine.kv.replay import MAX_REPLAY_GROUPS, replay_events


def _recording(tmp_path, group: int):
    header = {
        "kvscope_events": FORMAT_VERSION,
        "num_blocks": 8,
        "block_size": 4,
        "allocator": "paged",
        "max_seq_len": 32,
        "model": "m",
        "group_windows": [None] + [4] * (MAX_REPLAY_GROUPS - 1),
    }
    events = [
        ("sequence_added", dict(seq_id=0, request_id="r", sample=0, num_prompt_tokens=4)),
        ("sequence_admitted", dict(seq_id=0, query_tokens=4, hit_tokens=0, first=True)),
        ("blocks_allocated", dict(seq_id=0, blocks=[3], start=0, group=group)),
        ("step_progress", dict(lens=[[0, 4, 4]])),
    ]
    lines = [json.dumps(header)]
    lines += [json.dumps({"kind": kind, "step": 1, "time": 1.0, **f}) for kind, f in events]
    path = tmp_path / f"group{group}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_highest_group_a_header_may_declare_is_kept(tmp_path):
    for group in (127, 150, MAX_REPLAY_GROUPS - 1):
        (pool, _), *_ = replay_events(_recording(tmp_path, group))
        assert int(pool.group[3]) == group
        assert pool.metrics.group_blocks_used[group] == 1


def test_replay_prints_its_steps(tmp_path, capsys):
    assert main(["replay", str(_recording(tmp_path, 200))]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:2] == ["1", "1"]
