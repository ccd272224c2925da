"""The fused decode's choice between threads and one thread, driven with made-up step times."""

from kvscope.engine.model.parallel_choice import (
    FIRST_PROBE,
    PROBE_EVERY,
    PROBE_STEPS,
    ParallelChoice,
)


def _run(choice: ParallelChoice, steps: int, seconds, rows: int = 1) -> list[bool]:
    """`steps` steps whose time is seconds(parallel); the choices made, in order."""
    made = []
    for _ in range(steps):
        parallel = choice.for_step(rows)
        made.append(parallel)
        choice.record(rows, parallel, seconds(parallel))
    return made


def test_one_thread_never_runs_parallel():
    choice = ParallelChoice(1)
    assert _run(choice, 50, lambda p: 0.01) == [False] * 50


def test_a_quiet_machine_keeps_its_threads_and_still_tries_one():
    choice = ParallelChoice(4)
    made = _run(
        choice, FIRST_PROBE + PROBE_STEPS + PROBE_EVERY + PROBE_STEPS, lambda p: 0.01 if p else 0.03
    )
    assert choice.parallel
    tries = [i for i, p in enumerate(made) if not p]
    first = list(range(FIRST_PROBE, FIRST_PROBE + PROBE_STEPS))
    second = [i + PROBE_EVERY + PROBE_STEPS for i in first]
    assert tries == first + second  # short tries, spaced out: the cost of watching


def test_a_busy_core_switches_to_one_thread_and_back_when_it_frees():
    choice = ParallelChoice(2)
    busy = lambda p: 0.048 if p else 0.024  # noqa: E731  (2 threads with a hog: 2x slower)
    _run(choice, FIRST_PROBE + PROBE_STEPS, busy)
    assert not choice.parallel
    made = _run(choice, PROBE_EVERY, busy)
    assert made.count(True) <= PROBE_STEPS and not choice.parallel
    quiet = lambda p: 0.012 if p else 0.024  # noqa: E731
    _run(choice, 2 * (PROBE_EVERY + PROBE_STEPS), quiet)
    assert choice.parallel


def test_choices_are_compared_at_the_same_batch_size():
    """A try at another batch size says nothing about this one: no switch on mixed evidence."""
    choice = ParallelChoice(2)
    _run(choice, FIRST_PROBE, lambda p: 0.05, rows=8)  # parallel at 8 rows: slow but alone
    _run(choice, PROBE_STEPS, lambda p: 0.01, rows=1)  # the try ran at 1 row
    assert choice.parallel
