"""Whether a fused CPU decode step shares its matmuls among threads, chosen by measuring both.

numba's parallel matmuls split each matrix statically among the engine's threads and wait for
all of them at its end, 120 times a step on the bundled model. When another program holds one
of those cores, the thread that shares it runs only in the scheduler's slices and every matmul
waits for it: `kvscope bench --threads`-style runs on the 2-core AVX2 machine, batch-1 decode
with `python -c "while True: pass"` beside it, 2 threads fell from 79 to 21 tokens/s while one
thread held 41-44 (quiet 41-48). So the step times say which is faster now: the engine runs its
configured threads, tries one thread for a couple of steps every so often, and keeps whichever
was faster at that batch size, switching back when the machine frees up.
"""

from __future__ import annotations

import statistics
from collections import deque

PROBE_EVERY = 32  # steps between tries of the other choice
PROBE_STEPS = 2  # steps per try (the first after a switch of mode is kept too)
FIRST_PROBE = 4  # a busy machine is noticed within the first few steps of a reply
WINDOW = 8  # recent step times kept per (choice, rows)
MARGIN = 0.9  # the other choice must be this much faster (per step) to be taken


class ParallelChoice:
    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.parallel = threads > 1  # the choice in force between tries
        self._times: dict[tuple[bool, int], deque[float]] = {}
        self._steps = 0
        self._next_probe = FIRST_PROBE
        self._probe_left = 0

    def for_step(self, rows: int) -> bool:
        """Whether the coming step of `rows` decode rows runs its matmuls in parallel."""
        if self.threads <= 1:
            return False
        if self._probe_left == 0 and self._steps >= self._next_probe:
            self._probe_left = PROBE_STEPS
        return not self.parallel if self._probe_left else self.parallel

    def record(self, rows: int, parallel: bool, seconds: float) -> None:
        """The step just run took `seconds`; ends a try when its steps are done."""
        if self.threads <= 1:
            return
        self._steps += 1
        self._times.setdefault((parallel, rows), deque(maxlen=WINDOW)).append(seconds)
        if not self._probe_left:
            return
        self._probe_left -= 1
        if self._probe_left:
            return
        self._next_probe = self._steps + PROBE_EVERY
        # The try's own steps against the choice's recent ones: older tries' times may come
        # from a machine that was busy then.
        ours = self._times.get((self.parallel, rows))
        tried = list(self._times.get((not self.parallel, rows), ()))[-PROBE_STEPS:]
        if ours and len(tried) == PROBE_STEPS:
            if statistics.median(tried) < MARGIN * statistics.median(ours):
                self.parallel = not self.parallel
