"""Bound how long idle OpenMP threads spin, before torch (or numba) loads its OpenMP runtime.

Two OpenMP runtimes share this process's cores: the libgomp torch bundles and the system one
numba's threading layer links (it names libgomp.so.1.0.0, so the loader cannot hand it torch's).
After a parallel region each runtime keeps its idle workers spinning for GOMP's default 300,000
rounds, ~20 ms here, so a torch op right after a numba region (or the other way round) waits
for the other runtime's spinning thread to give its core up. Measured on the 2-core Xeon VM, two
threads: a 49k-float logsumexp right after a numba parallel loop took 22 ms instead of 29 us,
and Gemma 3 270M's 512-token prefill (torch ops between numba matmuls) ran at 87 tokens/s
instead of 1,620. 30,000 rounds (a millisecond or two) still bridge the gaps between one
runtime's back-to-back regions: the fused decode's tokens/s stayed within run-to-run noise
(1.1B Q4_0: 29.9 at the default, 30.7 at 30,000; Gemma 41.9 and 41.3).

The limit must be in the environment before a runtime loads (torch's at `import torch`), so
engine/__init__.py and app/__init__.py import this module first. A GOMP_SPINCOUNT or
OMP_WAIT_POLICY of the user's own wins; so does anything imported torch before us.
"""

import os
from collections.abc import MutableMapping

SPIN_ROUNDS = "30000"


def bound_openmp_spin(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set GOMP_SPINCOUNT unless the user chose a spin or wait policy; True when it set it."""
    if "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ:
        return False
    environ["GOMP_SPINCOUNT"] = SPIN_ROUNDS
    return True


bound_openmp_spin()
