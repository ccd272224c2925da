"""Benchmarks of the engine's own parts, for `kvscope bench`.

What only the engine can measure lives here: its model with attention swapped for a contiguous
baseline, its pool observers fed a full pool, its weight plan, synthetic model files built from
its GGUF reader, the decode kernel's split-K choice. The app's benchmarks reach the engine
through this package and the public API alone.
"""
