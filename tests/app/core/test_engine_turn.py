"""The one engine turn the desktop worker and `kvscope serve` share: drain every source, step,
deliver to every source; a step that raises fails every source's work and the engine goes on."""

from __future__ import annotations

from kvscope.app.core.engine_turn import run_turn
from kvscope.engine import SamplingParams


class Source:
    """A source of work that adds its requests on its first drain and records what it hears."""

    def __init__(self, engine, requests: dict[str, list[int]]) -> None:
        self.engine, self.pending = engine, dict(requests)
        self.drains, self.delivered, self.failures = 0, [], []

    def drain(self) -> None:
        self.drains += 1
        for request_id, prompt in self.pending.items():
            self.engine.add_request(request_id, prompt, SamplingParams(max_tokens=3))
        self.pending.clear()

    def deliver(self, outputs) -> None:
        self.delivered += [(o.request_id, o.finished) for o in outputs]

    def fail_all(self, error: Exception, engine_failed: bool = False) -> None:
        self.failures.append((str(error), engine_failed))


def test_a_turn_drains_every_source_then_steps_once_and_delivers_to_all(default_llm):
    engine = default_llm.engine
    chats = Source(engine, {"turn-a": [5, 6, 7]})
    served = Source(engine, {"turn-b": [8, 9]})
    turns = []
    while not turns or engine.has_unfinished_requests():
        turns.append(run_turn(engine, [chats, served]))
    assert all(t.stepped and t.error is None and t.seconds > 0 for t in turns)
    assert chats.drains == served.drains == len(turns)
    # every source hears every output (each keeps what is its own): both requests, to the end
    assert chats.delivered == served.delivered
    finished = {rid for rid, done in chats.delivered if done}
    assert finished == {"turn-a", "turn-b"}
    assert run_turn(engine, [chats]).stepped is False  # nothing left: no step


def test_a_step_that_raises_fails_every_source_and_the_engine_goes_on(default_llm, monkeypatch):
    engine = default_llm.engine
    chats = Source(engine, {"doomed": [5, 6, 7]})
    served = Source(engine, {})
    marks = []

    def broken_step():
        raise RuntimeError("step broken by the test")

    monkeypatch.setattr(engine, "step", broken_step)
    turn = run_turn(engine, [chats, served], before_step=lambda: marks.append("busy"))
    assert turn.stepped and isinstance(turn.error, RuntimeError) and marks == ["busy"]
    assert chats.failures == served.failures == [("step broken by the test", True)]
    assert chats.delivered == served.delivered == []
    monkeypatch.undo()
    engine.abort_request("doomed")  # what a source's fail_all does with its own
    again = Source(engine, {"after": [5, 6]})
    while not again.delivered or engine.has_unfinished_requests():
        assert run_turn(engine, [again]).error is None
    assert ("after", True) in again.delivered
