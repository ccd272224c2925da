"""A sweep in worker processes outlives a worker's death (issue 43): multiprocessing.Pool lost
the point a killed worker held and `imap` waited for it forever. A death costs a rerun of its
point; a point whose worker dies twice stops the sweep, naming it, and no worker is left."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest
from whatif_recordings import record_session

from kvscope.engine.trace import read_trace
from kvscope.engine.whatif import SweepWorkerDied, WhatIf, sweep

POINTS = [WhatIf(num_blocks=n) for n in (12, 16, 20, 24, 28, 32)]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return read_trace(record_session(tmp_path_factory.mktemp("sweep")))


def _kill(process: multiprocessing.process.BaseProcess) -> None:
    try:
        os.kill(process.pid, signal.SIGKILL)
    except (ProcessLookupError, TypeError):  # gone already, or not started
        pass


def test_a_worker_killed_mid_sweep_costs_a_rerun_not_a_hang(trace):
    here = [(p.what, p.summary, p.num_blocks) for p in sweep(trace, POINTS)]
    killed: list[int] = []

    def kill_one(point) -> None:
        if not killed:  # after the first point: the others are running, or about to
            victim = multiprocessing.active_children()[0]
            killed.append(victim.pid)
            _kill(victim)

    started = time.monotonic()
    there = sweep(trace, POINTS, workers=2, on_point=kill_one)
    assert time.monotonic() - started < 120
    assert killed
    assert [(p.what, p.summary, p.num_blocks) for p in there] == here
    assert not multiprocessing.active_children()


def test_a_point_whose_worker_dies_twice_stops_the_sweep_naming_it(trace):
    stop = threading.Event()

    def killer() -> None:  # every worker, as soon as it shows
        while not stop.is_set():
            for child in multiprocessing.active_children():
                _kill(child)
            time.sleep(0.05)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        with pytest.raises(SweepWorkerDied) as raised:
            sweep(trace, POINTS, workers=2)
    finally:
        stop.set()
        thread.join()
    assert time.monotonic() - started < 120
    message = str(raised.value)
    assert "SIGKILL" in message
    assert "sweep point" in message or "kept dying" in message
    assert not multiprocessing.active_children()


def test_the_command_line_says_which_point_and_exits_1(tmp_path, monkeypatch, capsys):
    from kvscope.app.cli.main import main

    def died(*args, **kwargs):
        raise SweepWorkerDied("sweep point 2 of 3 (num_blocks=16): its worker process died 2 times")

    monkeypatch.setattr("kvscope.engine.whatif.sweep", died)
    session = record_session(tmp_path)
    assert main(["whatif", str(session), "--set", "num_blocks=12,16", "--jobs", "2"]) == 1
    assert "error: sweep point 2 of 3 (num_blocks=16)" in capsys.readouterr().err
