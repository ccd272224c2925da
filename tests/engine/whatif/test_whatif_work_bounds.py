"""Everything that sizes a what-if's work is bounded before the work (issue 43): the pool
against this machine's memory, the grid's size, and each simulation's steps and seconds; a
run stopped by its budget or by Ctrl-C says so in words, not a traceback."""

from __future__ import annotations

import pytest
from whatif_recordings import record_session, with_trace_settings

import kvscope.engine.whatif as whatif
from kvscope.app.cli.main import main
from kvscope.engine.trace import read_trace
from kvscope.engine.whatif import (
    MAX_SWEEP_POINTS,
    SimBudget,
    SimulationStopped,
    SimulationTooLarge,
    WhatIf,
    grid,
    resolve,
    simulate,
    sweep,
)
from kvscope.engine.whatif import settings as settings_module


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return record_session(tmp_path_factory.mktemp("bounds"))


@pytest.mark.parametrize("blocks", [10**8, 2**31])
def test_a_header_pool_past_the_cap_is_refused_before_anything_is_built(
    session, tmp_path, capsys, blocks
):
    bomb = with_trace_settings(session, tmp_path / "bomb.jsonl", num_blocks=blocks)
    with pytest.raises(ValueError, match=rf"header trace num_blocks {blocks} .*16,777,216"):
        read_trace(bomb)
    assert main(["whatif", str(bomb), "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err


@pytest.mark.parametrize(
    "setting, named",
    [
        ("num_blocks=100000000", "num_blocks 100,000,000"),
        ("kv_pool=1PiB", "kv_pool 1.00 PiB (549,755,813,888 blocks)"),
    ],
)
def test_a_knob_past_the_cap_exits_2_naming_value_and_limit(session, capsys, setting, named):
    assert main(["whatif", str(session), "--set", setting, "--jobs", "1"]) == 2
    captured = capsys.readouterr()
    assert f"error: {named} is more than a what-if simulates here: at most " in captured.err
    assert "blocks" in captured.err and "simulations in" not in captured.out


def test_the_limit_follows_the_memory_this_machine_has(session, monkeypatch):
    recorded = read_trace(session).settings
    # 1,000 simulated blocks' worth of memory available.
    available = 1000 * settings_module.SIM_BYTES_PER_BLOCK
    monkeypatch.setattr(settings_module, "system_memory", lambda: (available, available))
    assert resolve(recorded, WhatIf(num_blocks=1000)).num_blocks == 1000
    with pytest.raises(SimulationTooLarge, match=r"num_blocks 1,001 .* at most 1,000 blocks"):
        resolve(recorded, WhatIf(num_blocks=1001))
    with pytest.raises(SimulationTooLarge, match="this machine has"):
        simulate(read_trace(session), WhatIf(num_blocks=5000))
    assert whatif.simulated_pool_limit(simultaneous=4)[0] == 250


def test_a_grid_past_the_bound_is_refused_before_it_is_made(session, capsys):
    values = ",".join(str(v) for v in range(1, 12))
    args = ["whatif", str(session), "--jobs", "1"]
    assert (
        main(
            [*args, "--set", f"max_num_seqs={values}"] * 1
            + ["--set", f"num_blocks={values}", "--set", f"max_batched_tokens={values}"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert (
        f"1,331 combinations of settings (11 x 11 x 11) are more than the {MAX_SWEEP_POINTS:,}"
        in err
    )
    with pytest.raises(ValueError, match="combinations of settings"):
        grid({"max_num_seqs": range(1, 101), "num_blocks": range(1, 101), "block_size": [8, 16]})


def test_a_simulation_past_its_step_budget_stops_saying_how_far_it_got(session):
    trace = read_trace(session)
    tight = WhatIf(max_batched_tokens=1)  # a token a step: far more steps than recorded
    with pytest.raises(SimulationStopped) as stopped:
        simulate(trace, tight, budget=SimBudget(max_steps=20))
    assert str(stopped.value).startswith(
        "stopped after 20 steps, its step budget: 20 steps simulated ("
    )
    assert "0 of 6 requests finished" in str(stopped.value)
    [point] = sweep(trace, [tight], budget=SimBudget(max_steps=20))
    assert point.summary is None and point.error == str(stopped.value)
    # The default budget holds the recording's own replay with room to spare.
    assert SimBudget.for_trace(trace).max_steps >= 10 * len(trace.steps)
    assert simulate(trace).summary.steps == len(trace.steps)


def test_a_time_budget_stops_it_too(session):
    with pytest.raises(SimulationStopped, match=r"past its time budget of 0 s"):
        simulate(read_trace(session), WhatIf(max_batched_tokens=1), budget=SimBudget(10**6, 0.0))


def test_ctrl_c_ends_the_command_with_a_line(session, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(whatif, "sweep", interrupted)
    assert main(["whatif", str(session), "--set", "block_size=32", "--jobs", "1"]) == 130
    err = capsys.readouterr().err
    assert "interrupted after 0 simulations" in err and "Traceback" not in err


def test_without_settings_the_recording_runs_once(session, capsys):
    assert main(["whatif", str(session), "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("as recorded") == 1 and "1 simulations in" in out
