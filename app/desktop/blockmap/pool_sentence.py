"""The settings dialog's sentences about the KV pool, whose numbers add up for every KV layout.

A model whose layers all attend alike (Llama, Qwen) keeps one KV group: a block is
`block_size` tokens of every layer, so blocks x block size = tokens and tokens / context =
full contexts. A hybrid model (Gemma 3: 5 sliding to 1 full) keeps one block table per group
(engine/kv/layout.py): a block is `block_size` tokens of one group's layers, and a sliding
group holds only its window's blocks. There a single "tokens" figure means nothing (the dialog
once said "5,461 blocks of 16 = 14,560 tokens", counting every group holding every token, next
to "18.6 full contexts", counting the windows), so the sentence says what a block holds and
adds up the blocks one context takes, group by group.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from kvscope.engine.model.model_config import ModelConfig
from kvscope.engine.sizing import planner


@dataclass(frozen=True)
class PoolFigures:
    """What one pool holds for one context length, by KV group kind."""

    num_blocks: int
    block_size: int
    context: int
    num_layers: int
    group_size: int  # layers one block holds (every layer when there is one group)
    bytes_per_block: int
    # (window or None, number of groups, blocks one context takes in each), full first.
    kinds: tuple[tuple[int | None, int, int], ...]

    @property
    def num_groups(self) -> int:
        return sum(n for _, n, _ in self.kinds)

    @property
    def blocks_per_context(self) -> int:
        return sum(n * each for _, n, each in self.kinds)

    @property
    def full_contexts(self) -> float:
        return self.num_blocks / max(1, self.blocks_per_context)


def pool_figures(
    mc: ModelConfig, block_size: int, kv_dtype: object, num_blocks: int, context: int
) -> PoolFigures:
    """The figures the sentence states, from the planner's layout (the engine's own)."""
    layout = planner.kv_layout_of(mc, block_size)
    context_blocks = -(-context // block_size)
    counts = Counter(layout.windows)
    kinds = []
    for window in sorted(counts, key=lambda w: (w is not None, w or 0)):
        # What KVLayout.max_blocks_held counts a group at while decoding (a chunk of 1).
        each = (
            context_blocks if window is None else min(context_blocks, -(-window // block_size) + 1)
        )
        kinds.append((window, counts[window], each))
    per_block = block_size * planner.bytes_per_token(
        layout.group_size, mc.num_kv_heads, mc.head_dim, kv_dtype
    )
    return PoolFigures(
        num_blocks, block_size, context, mc.num_layers, layout.group_size, per_block, tuple(kinds)
    )


def block_sentence(f: PoolFigures) -> str:
    """What one block is, in bytes: "a block is 16 tokens of all 30 layers, 368,640 B"."""
    layers = (
        f"all {f.num_layers} layers"
        if f.group_size == f.num_layers
        else f"{f.group_size} of the {f.num_layers} layers (one of {f.num_groups} KV groups)"
    )
    return f"a block is {f.block_size} tokens of {layers}, {f.bytes_per_block:,} B"


def pool_sentence(f: PoolFigures, budget: str) -> str:
    """`budget` ("256 MiB") holds so many blocks: tokens and contexts for one group, the blocks
    a context takes group by group (and what each window changes) for several."""
    head = f"{budget} holds {f.num_blocks:,} blocks of {f.block_size}"
    context = f"{f.context:,}"
    if len(f.kinds) == 1 and f.kinds[0][1] == 1:
        window, _, each = f.kinds[0]
        tokens = f"{head} = {f.num_blocks * f.block_size:,} tokens"
        if window is None or each == -(-f.context // f.block_size):
            slide = "" if window is None else f"; the {window:,}-token window is no shorter"
            return (
                f"{tokens} ({f.full_contexts:.1f} full contexts of {context} tokens, "
                f"{each:,} blocks each{slide})"
            )
        return (
            f"{tokens}; every layer keeps {_a(window)} {window:,}-token window, so "
            f"{_a(f.context)} {context}-token "
            f"context holds {_window_blocks(window, f.block_size)}; the pool holds "
            f"{f.full_contexts:.1f} full contexts ({f.num_blocks:,} / {each:,})"
        )
    parts = []
    notes = []
    for window, n, each in f.kinds:
        name = "full-attention" if window is None else "sliding"
        parts.append(f"{each:,} × {n} {name} group{'s' if n != 1 else ''}")
        if window is not None:
            if each < -(-f.context // f.block_size):
                notes.append(
                    f"a {window:,}-token window holds {_window_blocks(window, f.block_size)}"
                )
            else:
                notes.append(f"the {window:,}-token window is no shorter than the context")
    return (
        f"{head} tokens, each of one KV group; {_a(f.context)} {context}-token context holds "
        f"{' + '.join(parts)} = {f.blocks_per_context:,} blocks ({'; '.join(notes)}), so the "
        f"pool holds {f.full_contexts:.1f} full contexts ({f.num_blocks:,} / "
        f"{f.blocks_per_context:,})"
    )


def _window_blocks(window: int, block_size: int) -> str:
    """A sliding group's blocks per context and where they come from: "⌈512/16⌉ + 1 = 33
    blocks, one more for a window that starts mid-block"."""
    each = -(-window // block_size) + 1
    return (
        f"⌈{window:,}/{block_size}⌉ + 1 = {each:,} blocks, one more for a window that starts "
        "mid-block"
    )


def _a(n: int) -> str:
    """The article before a number read aloud: "an 8-token window", "an 11,000", "a 512"."""
    text = str(n)
    eleven = text[:2] in ("11", "18") and len(text) % 3 == 2
    return "an" if text.startswith("8") or eleven else "a"
