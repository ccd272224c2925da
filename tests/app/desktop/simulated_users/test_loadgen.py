"""Load generator: seeded, closed-loop, Poisson arrivals, shared system prompt; its panel."""

from __future__ import annotations

import pytest

from kvscope.app.desktop.simulated_users.loadgen import LoadGenerator, LoadSpec, system_prompt


def run(gen: LoadGenerator, until: float, step: float = 0.25, finish_after: float = 0.0):
    """Drive a generator like the worker does; each request finishes `finish_after` later."""
    sent, pending = [], []
    t = 0.0
    while t <= until:
        for rid, done in [p for p in pending if p[1] <= t]:
            gen.on_finished(rid, now=done)
            pending.remove((rid, done))
        for req in gen.due(t):
            sent.append((t, req))
            pending.append((req.request_id, t + finish_after))
        t += step
    return sent


def test_same_seed_same_requests():
    spec = LoadSpec(num_users=3, prompt_tokens=(64, 300), output_tokens=(8, 40), seed=7)
    a = run(LoadGenerator(spec), until=30, finish_after=1.0)
    b = run(LoadGenerator(spec), until=30, finish_after=1.0)
    assert len(a) > 5
    key = [(t, r.request_id, r.prompt, r.params.max_tokens, r.params.seed) for t, r in a]
    assert key == [(t, r.request_id, r.prompt, r.params.max_tokens, r.params.seed) for t, r in b]
    other = run(LoadGenerator(LoadSpec(**{**spec.__dict__, "seed": 8})), 30, finish_after=1.0)
    assert [r.prompt for _, r in other] != [r.prompt for _, r in a]


def test_request_shape():
    gen = LoadGenerator(LoadSpec(num_users=2, prompt_tokens=(100, 100), output_tokens=(20, 30)))
    (_, req), *_ = run(gen, until=20)
    assert req.request_id.startswith(f"load-{req.user}/")
    p = req.params
    assert p.ignore_eos and p.temperature == 0.8 and 20 <= p.max_tokens <= 30 and p.seed is not None
    assert req.prompt_tokens == 100
    # Sized from characters, about 4-5 per token: roughly, not exactly.
    assert 300 < len(req.prompt) < 600
    assert req.messages[0]["role"] == "system" and req.messages[-1]["role"] == "user"


def test_each_user_has_one_request_in_flight():
    gen = LoadGenerator(LoadSpec(num_users=4, arrival_rate_per_s=50.0))
    first = gen.due(0.0) + gen.due(10.0)
    assert sorted(r.user for r in first) == [0, 1, 2, 3]  # all arrived, once each
    assert gen.due(20.0) == []  # nobody finished: nobody sends again
    assert len(gen.in_flight) == 4
    gen.on_finished(first[0].request_id, now=20.0)
    gen.on_finished("conv-1/turn-0")  # not ours: ignored
    again = gen.due(1000.0)
    assert [r.user for r in again] == [first[0].user]
    assert again[0].request_id == f"load-{first[0].user}/1"


def test_arrivals_follow_the_rate():
    rate, users, horizon = 2.0, 50, 200.0
    gen = LoadGenerator(LoadSpec(num_users=users, arrival_rate_per_s=rate, seed=3))
    sent = run(gen, until=horizon, step=0.5)  # instant service: users only think
    assert len(sent) == pytest.approx(rate * horizon, rel=0.15)


def test_shared_system_prompt_is_identical_across_users():
    spec = LoadSpec(num_users=5, prompt_tokens=(200, 400), arrival_rate_per_s=20.0, seed=1)
    reqs = [r for _, r in run(LoadGenerator(spec), until=10)]
    system = system_prompt(spec.system_prompt_tokens)
    assert len({r.user for r in reqs}) == 5 and len(system) > 400
    assert all(r.prompt.startswith(system + "\n\n") for r in reqs)
    assert all(r.messages[0]["content"] == system for r in reqs)

    private = LoadSpec(**{**spec.__dict__, "shared_system_prompt": False})
    reqs = [r for _, r in run(LoadGenerator(private), until=10)]
    starts = {r.prompt[:40] for r in reqs}
    assert len(starts) == len(reqs)  # no two requests open alike
    assert all(len(r.messages) == 1 for r in reqs)


def test_stop_sends_nothing_more():
    gen = LoadGenerator(LoadSpec(num_users=2, arrival_rate_per_s=10.0))
    gen.due(0.0)
    gen.stop()
    assert gen.due(100.0) == [] and gen.next_arrival() is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_users": 0},
        {"prompt_tokens": (300, 100)},
        {"output_tokens": (0, 10)},
        {"arrival_rate_per_s": 0.0},
        {"arrival_rate_per_s": float("inf")},
        {"seed": -1},
        {"shared_system_prompt": 1},
    ],
)
def test_spec_rejects_bad_values(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        LoadSpec(**kwargs)


def test_panel_emits_the_spec(qtbot):
    from kvscope.app.desktop.simulated_users.panel import LoadGeneratorPanel

    panel = LoadGeneratorPanel()
    qtbot.addWidget(panel)
    panel.users.setValue(6)
    panel.prompt.low.setValue(900)  # past the max: the max follows
    panel.shared.setChecked(False)
    panel.rate.setValue(3.5)
    with qtbot.waitSignal(panel.start_requested) as blocker:
        panel.start.click()
    spec = blocker.args[0]
    assert spec.num_users == 6 and spec.prompt_tokens == (900, 900)
    assert not spec.shared_system_prompt and spec.arrival_rate_per_s == 3.5
    assert not panel.start.isEnabled() and panel.stop.isEnabled() and not panel.users.isEnabled()
    with qtbot.waitSignal(panel.stop_requested):
        panel.stop.click()
    assert panel.start.isEnabled()
    panel.set_spec(LoadSpec(num_users=2, prompt_tokens=(32, 64)))
    assert panel.spec().prompt_tokens == (32, 64) and panel.spec().num_users == 2
