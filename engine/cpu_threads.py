"""How many CPU threads the engine's math runs on, and why the default leaves a core free.

torch's CPU kernels split each op statically across their OpenMP threads, and every op ends in a
barrier. When another program holds one of those cores (a desktop is rarely idle: the browser, the
GUI thread of this very app), the thread that shares it runs only in the scheduler's time slices,
and every op waits for it. `kvscope bench --threads` on a 2-core AVX2 machine, batch-1 decode of
the bundled model, quiet / with a second process spinning on one core: 1 thread 22.7 / 19.7
tokens/s, 2 threads 31.9 / 8.0. One thread fewer than
the cores gives up part of an idle machine's speed (29% there; less where there are more cores
to keep) and never collapses like that, so the default is the physical cores less one (SMT
siblings share a core's execution units and add little to this work), at least 1.

Inter-op parallelism is off (1 thread): the engine runs one op after another, and an idle inter-op
pool only adds threads that compete for the same cores.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = ["apply_num_threads", "default_num_threads", "physical_cores", "usable_cpus"]

MAX_DEFAULT_THREADS = 16  # beyond this a decode step stops scaling on the machines we target
_SYSFS_CPU = Path("/sys/devices/system/cpu")


def usable_cpus() -> list[int]:
    """The logical CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def physical_cores(cpus: list[int] | None = None, sysfs: Path = _SYSFS_CPU) -> int:
    """Physical cores among `cpus`: logical CPUs that are SMT siblings of each other count once.

    Reads Linux's topology files; where they are missing (Windows, macOS, containers hiding
    sysfs), every logical CPU counts as a core."""
    cpus = usable_cpus() if cpus is None else cpus
    cores: set[str] = set()
    for cpu in cpus:
        siblings = sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list"
        try:
            cores.add(siblings.read_text().strip())
        except OSError:
            return len(cpus)
    return len(cores) or len(cpus)


def default_num_threads(cores: int | None = None) -> int:
    """Physical cores less one, at least 1, at most MAX_DEFAULT_THREADS (see the module doc)."""
    cores = physical_cores() if cores is None else cores
    return max(1, min(cores - 1, MAX_DEFAULT_THREADS))


def apply_num_threads(num_threads: int | None) -> int:
    """Set torch's intra-op threads for this process (None: the default); returns the count.

    torch's thread count is per process, so the last engine built sets it for all of them; the
    worker thread that steps an engine inherits it (torch propagates it to new threads)."""
    n = default_num_threads() if num_threads is None else num_threads
    if n < 1:
        raise ValueError(f"num_threads must be >= 1, got {n}")
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    _single_interop_thread()
    return n


def _single_interop_thread() -> None:
    # Settable only before the first inter-op work starts; later calls raise, and by then the
    # setting is whatever it was, which costs idle threads, not correctness.
    if torch.get_num_interop_threads() == 1:
        return
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
