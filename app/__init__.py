"""KVScope's desktop app and command line (the only layer that knows about Qt)."""

# Before any module of ours loads torch: the engine package bounds OpenMP's idle spinning first
# (engine/omp_spin.py).
from kvscope import engine  # noqa: E402, F401
