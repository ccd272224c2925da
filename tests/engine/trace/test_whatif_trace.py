"""The traffic trace as a file and a ring, the what-if knobs as text, the cost model's fit, and
`kvscope whatif` on a real recording."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from sliding_models import make_sliding_model

from kvscope.app.cli.main import main
from kvscope.engine import EngineConfig, LLMEngine, SamplingParams
from kvscope.engine.trace import StepShape, TracedStep, TraceLog, read_trace
from kvscope.engine.whatif import CostModel, WhatIf, cost_caveat, resolve, simulate


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """A recorded session of a tiny two-group model: 6 requests, one aborted mid-reply."""
    folder = tmp_path_factory.mktemp("trace")
    model = make_sliding_model("qwen2", folder / "m", 24, seed=2)
    engine = LLMEngine(
        EngineConfig(
            model=str(model), device="cpu", dtype="float32", block_size=8, num_kv_blocks=40
        )
    )
    path = folder / "session.jsonl"
    engine.start_recording(path)
    for i in range(6):
        params = SamplingParams(max_tokens=10 + 3 * i, temperature=0.0, ignore_eos=True)
        engine.add_request(f"c{i}", [2 + (5 * i + j) % 400 for j in range(12 + 7 * i)], params)
    while engine.has_unfinished_requests():
        engine.step()
        if engine.num_steps == 6:
            engine.abort_request("c5")
    engine.stop_recording()
    return path, engine


def test_the_file_holds_what_the_engine_did(recording):
    path, engine = recording
    trace = read_trace(path)
    live = engine.trace.trace()
    assert trace.settings == live.settings
    assert trace.requests == live.requests and trace.steps == live.steps
    assert trace.finishes == live.finishes
    assert trace.finishes["c5"].reasons == ("abort",)
    assert len(trace.finishes["c5"].outputs[0]) < 25
    assert trace.complete
    # The aborted request stops where it stopped: its own replay is still exact.
    result = simulate(trace)
    assert result.diverged_at is None
    assert [s.counts for s in result.steps] == [s.counts for s in trace.steps]


def _rewrite(src, dst, edit) -> None:
    lines = src.read_text().splitlines()
    dst.write_text("\n".join(edit(lines)) + "\n")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda ls: [_drop_trace(ls[0])] + ls[1:], "has no traffic trace"),
        (lambda ls: [ls[0].replace('"num_layers": 2', '"num_layers": -2')] + ls[1:], "num_layers"),
        (
            lambda ls: ls + [json.dumps({"kind": "trace_step", "step": 1, "time": 0.0})],
            "trace_step event lacks fields",
        ),
        (lambda ls: ls + [_line_like(ls, "trace_request")], "arrives twice"),
        (lambda ls: ls + [_line_like(ls, "trace_finish")], "ends without having arrived"),
        (lambda ls: ls + [_line_like(ls, "trace_step")], "comes after step"),
        (
            lambda ls: ls + [_line_like(ls, "trace_request", prompt_token_ids=[-1])],
            "an int >= 0",
        ),
    ],
    ids=[
        "v3-no-trace",
        "bad-settings",
        "missing-fields",
        "twice",
        "orphan-end",
        "step-order",
        "neg",
    ],
)
def test_a_damaged_trace_is_a_clear_error(recording, tmp_path, edit, message):
    path, _ = recording
    bad = tmp_path / "bad.jsonl"
    _rewrite(path, bad, edit)
    with pytest.raises(ValueError, match=message):
        read_trace(bad)


def _drop_trace(header: str) -> str:
    record = json.loads(header)
    record.pop("trace")
    record["kvscope_events"] = 3
    return json.dumps(record)


def _line_like(lines: list[str], kind: str, **changes) -> str:
    """A copy of the file's first line of `kind` (with changes): a duplicate of it."""
    record = next(json.loads(line) for line in lines[1:] if f'"kind":"{kind}"' in line)
    if kind == "trace_finish":
        record["request_id"] = "nobody"
    if kind == "trace_request" and changes:
        record["request_id"] = "fresh"
    return json.dumps({**record, **changes})


@pytest.mark.parametrize("bound", [{"max_requests": 2}, {"max_tokens": 60}])
def test_the_ring_drops_the_oldest_and_says_so(recording, bound):
    """Two requests kept, by count or by token ids (each holds 20 prompt + 8 output)."""
    _, old = recording
    engine = LLMEngine(old.config)
    engine.trace = TraceLog(engine.trace.settings, **bound)
    for i in range(4):  # one after the other: each finishes before the next arrives
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        engine.add_request(f"s{i}", [3 + i] * 20, params)
        while engine.has_unfinished_requests():
            engine.step()
    trace = engine.trace.trace()
    assert [r.request_id for r in trace.requests] == ["s2", "s3"]
    assert trace.trimmed and not trace.complete
    # It starts where its oldest request arrived, with the steps from there on.
    assert trace.start_step == trace.requests[0].step == 16
    assert [s.step for s in trace.steps] == list(range(17, 33))
    assert simulate(trace).summary.requests == 2
    assert engine.trace.num_tokens == 2 * 28


def test_knobs_from_text_and_their_errors(recording):
    _, engine = recording
    what = WhatIf.from_text(
        {"kv_pool": "1MiB", "block_size": "32", "prefix_caching": "off", "rate_scale": "x2"}
    )
    assert what == WhatIf(kv_pool=1 << 20, block_size=32, prefix_caching=False, rate_scale=2.0)
    config = resolve(engine.trace.settings, what)
    # One layer per block in each of the two KV groups, float32: 2 x 32 x 2 x 16 x 4 bytes.
    assert config.bytes_per_block == 8192 and config.num_blocks == 128
    fp8 = resolve(engine.trace.settings, WhatIf(kv_dtype="fp8"))
    assert fp8.num_blocks == 4 * engine.trace.settings.num_blocks  # float32 -> 1 byte
    for text, message in (
        ({"colour": "red"}, "unknown what-if setting 'colour'"),
        ({"block_size": "big"}, "block_size takes a whole number, got 'big'"),
        ({"prefix_caching": "maybe"}, "prefix_caching takes on or off"),
        ({"kv_pool": "lots"}, "not a byte count"),
    ):
        with pytest.raises(ValueError, match=message):
            WhatIf.from_text(text)
    for what, message in (
        (WhatIf(block_size=12), "block_size 12 is not one of"),
        (WhatIf(kv_pool=100), "holds no block"),
        (WhatIf(max_model_len=10**6), "is not in \\[2, 512\\]"),
        (WhatIf(rate_scale=0), "rate_scale 0"),
        (WhatIf(kv_dtype="int3"), "kv_dtype 'int3'"),
    ):
        with pytest.raises(ValueError, match=message):
            resolve(engine.trace.settings, what)


def test_the_cost_model_finds_the_costs_it_was_made_of():
    rng = np.random.default_rng(0)
    # fixed, prompt chunk, prompt token, beside decodes, decode, context
    truth = (0.004, 0.01, 2e-4, 1.5e-3, 8e-4, 2e-6)
    steps = []
    for i in range(1000):
        decodes = int(rng.integers(0, 16))
        prefill = int(rng.integers(0, 400)) if i % 3 == 0 or not decodes else 0
        chunks = int(rng.integers(1, 4)) if prefill else 0
        shape = StepShape(prefill, chunks, decodes, int(rng.integers(10, 4000)))
        x = (1, chunks, prefill, prefill if decodes else 0, decodes, shape.context_tokens)
        duration = float(np.dot(truth, x)) * float(rng.normal(1.0, 0.02))
        steps.append(TracedStep(i + 1, i, duration, *_shape_fields(shape), *([0] * 6)))
    steps[5] = TracedStep(6, 5, 2.0, *_shape_fields(steps[5].shape), *([0] * 6))  # a stall
    model = CostModel.fit(steps)
    assert model.coefficients == pytest.approx(truth, rel=0.08)
    assert model.mean_abs_error < 0.05
    assert "fitted to 1000 steps" in model.describe()


def _shape_fields(shape: StepShape) -> tuple:
    return shape.prefill_tokens, shape.prefill_seqs, shape.decode_seqs, shape.context_tokens


def test_the_command_prints_a_row_per_setting_and_writes_json(recording, tmp_path, capsys):
    path, _ = recording
    out = tmp_path / "out.json"
    args = ["whatif", str(path), "--set", "block_size=8,32", "--set", "num_blocks=12,40"]
    assert main([*args, "--json", str(out), "--jobs", "1"]) == 0
    printed = capsys.readouterr().out
    assert "recorded run" in printed and "num_blocks=12, block_size=32" in printed
    report = json.loads(out.read_text())
    rows = {row["what"]: row for row in report["rows"]}
    assert len(rows) == 6  # the recording, as recorded, and 2 x 2
    assert (
        rows["as recorded"]["summary"]["preemptions"]
        == (rows["recorded run"]["summary"]["preemptions"])
    )
    assert rows["num_blocks=12, block_size=8"]["summary"]["preemptions"] > 0
    assert main(["whatif", str(path), "--set", "block_size"]) == 2
    assert "--set takes NAME=V1,V2" in capsys.readouterr().err
    assert main(["whatif", str(tmp_path / "none.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_recording_begun_on_cached_blocks_says_its_replay_starts_without_them(
    recording, tmp_path
):
    _, old = recording
    engine = LLMEngine(old.config)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    for name in ("first", "second"):
        path = tmp_path / f"{name}.jsonl"
        engine.start_recording(path)
        engine.add_request(name, [9] * 40, params)
        while engine.has_unfinished_requests():
            engine.step()
        engine.stop_recording()
    assert read_trace(tmp_path / "first.jsonl").complete
    second = read_trace(tmp_path / "second.jsonl")
    assert not second.complete
    assert "cached blocks when recording began" in second.notes[0]
    assert second.start_step == second.requests[0].step > 0


def test_a_kv_dtype_the_recording_did_not_run_says_its_cost_is_not_modelled(
    recording, tmp_path, capsys
):
    """The cost model has no dtype term: a what-if of another KV dtype says so, and on a CPU
    an fp8 cache over a bfloat16 one (off the fused decode path) says more."""
    path, engine = recording
    settings = read_trace(path).settings
    assert settings.kv_dtype == "float32"
    assert cost_caveat(settings, resolve(settings, WhatIf())) == ""
    fp8 = cost_caveat(settings, resolve(settings, WhatIf(kv_dtype="fp8")))
    assert "float32 KV cache" in fp8 and "fp8 cache's own cost" in fp8
    assert "fused decode path" not in fp8  # a float32 run had no fused path to leave
    bf16 = dataclasses.replace(settings, kv_dtype="bfloat16")
    assert "fused decode path" in cost_caveat(bf16, resolve(bf16, WhatIf(kv_dtype="fp8")))
    assert "fused" not in cost_caveat(bf16, resolve(bf16, WhatIf(kv_dtype="float32")))

    out = tmp_path / "dtype.json"
    args = ["whatif", str(path), "--set", "kv_dtype=fp8,float32", "--json", str(out)]
    assert main([*args, "--jobs", "1"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note (")]
    assert notes == [f"note (kv_dtype=fp8): {fp8}"]
    rows = {row["what"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["kv_dtype=fp8"]["caveat"] == fp8 and rows["kv_dtype=float32"]["caveat"] == ""
