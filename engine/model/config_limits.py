"""Plausibility limits for a model's declared sizes, checked before anything is allocated.

A header is data from a file: `block_count` 10^9 or `context_length` 2^32 - 1 must be refused
with a message, not discovered by allocating for them. The limits are far above any model the
engine can run (the largest open models have ~128 layers, 16k hidden, 256k vocabularies, 10M
context), so they only ever catch corrupt or hostile files.
"""

from __future__ import annotations

LIMITS = {
    "layers": (1, 1024),
    "hidden": (1, 1 << 16),
    "intermediate": (1, 1 << 20),
    "heads": (1, 1024),
    "kv_heads": (1, 1024),
    "head_dim": (1, 1024),
    "vocab": (1, 1 << 22),
    "context": (2, 1 << 24),  # 2: one prompt token and one generated
}


def check_sizes(source: str, **values: tuple[str, object]) -> None:
    """values: kind=(the file's own key name, value). Raises ValueError naming key and limit."""
    for kind, (key, value) in values.items():
        low, high = LIMITS[kind]
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ValueError(
                f"{source}: {key} {value!r} is not a plausible model size (expected an integer "
                f"from {low:,} to {high:,}); the file is corrupt or not a model this engine runs"
            )


def check_layer_count(source: str, key: str, declared: int, indices: set[int]) -> None:
    """The declared layer count against the layers the tensors actually cover."""
    if indices != set(range(declared)):
        found = len(indices)
        raise ValueError(
            f"{source}: {key} {declared:,} does not match the file, which has tensors for "
            f"{found:,} layers" + (f" (indices {min(indices)}..{max(indices)})" if indices else "")
        )
