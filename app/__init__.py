"""KVScope's desktop app and command line (the only layer that knows about Qt)."""

# Before any module of ours loads torch: OpenMP's idle spinning bounded (engine/omp_spin.py).
import engine.omp_spin  # noqa: E402, F401
