"""Chat templates that would hang or balloon an unbounded renderer, and a peak-RSS probe: shared by
the template budget's tests and the server's."""

from __future__ import annotations

import threading
import time

NESTED_LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
CONCAT_LOOP = (
    "{% set ns = namespace(s='x') %}"
    "{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def peak_rss_during(fn) -> int:
    """How far the process's RSS rose above where it was while `fn` ran (sampled)."""
    base, peak, done = rss_bytes(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes() - base)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        fn()
    finally:
        done.set()
        sampler.join()
    return max(peak[0], rss_bytes() - base)
