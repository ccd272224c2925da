"""KVLayout: how a model's layers share the one physical KV pool, in groups of equal size.

Layers that attend the same way (full attention, or a sliding window of W tokens) form a kind.
Every kind is cut into groups of `group_size` layers, the size of the smallest kind (vLLM's hybrid
KV cache scheme): a physical block holds `group_size` layers' K/V for `block_size` tokens of one
sequence, and belongs to one group at a time. Each group has its own block table per sequence,
so a sliding group can give back the blocks that fell out of its window while a full group keeps
all of them; both draw from, and return to, the same pool.

- Every layer full (Llama, Qwen): one group of all layers, the layout the engine always had.
- Every layer sliding with one window (Mistral): one sliding group of all layers.
- Gemma 3 (5 sliding : 1 full, 18 layers): group_size 3, five sliding groups and one full group.

The pool tensor has `group_size` layer slots; layer i lives in slot `slot_of[i]` of whatever
block its group's table names. A kind whose layer count is not a multiple of group_size has a
last group with fewer layers: its blocks leave the remaining slots unused.

`honour_windows=False` lays every model out as one group whose layers keep their windows in the
kernels but never release blocks: what the engine did before pages were released (the
comparison `kvscope bench` measures).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVGroup:
    window: int | None  # tokens a layer of this group attends to; None = full attention
    layers: tuple[int, ...]  # model layer indices, in slot order


@dataclass(frozen=True)
class KVLayout:
    groups: tuple[KVGroup, ...]
    group_size: int  # layer slots per physical block
    block_size: int

    @classmethod
    def single(cls, num_layers: int, block_size: int) -> KVLayout:
        """One full-attention group of every layer."""
        return cls((KVGroup(None, tuple(range(num_layers))),), num_layers, block_size)

    @classmethod
    def for_windows(
        cls, windows: tuple[int | None, ...], block_size: int, honour_windows: bool = True
    ) -> KVLayout:
        """The layout for layers with these windows (ModelConfig.layer_windows())."""
        if not windows:
            raise ValueError("a model has at least one layer")
        kinds: dict[int | None, list[int]] = {}
        for layer, window in enumerate(windows):
            kinds.setdefault(window, []).append(layer)
        if not honour_windows or len(kinds) == 1:
            # One group; its window is the layers' only window, or None when released blocks
            # are not wanted (the kernels still mask each layer at its own window).
            window = next(iter(kinds)) if honour_windows else None
            return cls((KVGroup(window, tuple(range(len(windows)))),), len(windows), block_size)
        size = min(len(layers) for layers in kinds.values())
        groups = []
        # Full attention first: group 0 then holds every token, which is what a table with
        # one row per sequence (SequenceInfo.block_table of older readers) shows best.
        for window in sorted(kinds, key=lambda w: (w is not None, w or 0)):
            layers = kinds[window]
            for lo in range(0, len(layers), size):
                groups.append(KVGroup(window, tuple(layers[lo : lo + size])))
        return cls(tuple(groups), size, block_size)

    # ---- where a layer lives -------------------------------------------------------------
    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def windows(self) -> tuple[int | None, ...]:
        """Each group's window."""
        return tuple(g.window for g in self.groups)

    def placement(self) -> tuple[tuple[int, int], ...]:
        """(group, slot) of every model layer, by layer index."""
        where = {}
        for g, group in enumerate(self.groups):
            for slot, layer in enumerate(group.layers):
                where[layer] = (g, slot)
        return tuple(where[i] for i in range(len(where)))

    # ---- how many blocks a sequence holds --------------------------------------------------
    def first_needed_block(self, group: int, next_position: int) -> int:
        """The first logical block group `group` still needs when the next token to compute
        sits at `next_position`: a window W sees keys p - W < j <= p, so every block wholly
        before next_position - W + 1 can go back to the pool."""
        window = self.groups[group].window
        if window is None:
            return 0
        return max(0, next_position - window + 1) // self.block_size

    def max_blocks_held(self, num_tokens: int, chunk: int) -> int:
        """The most physical blocks one sequence of up to `num_tokens` tokens holds at once over
        all groups, computing at most `chunk` tokens a step: a full group holds every block, a
        sliding group at most the blocks under its window plus the chunk, plus one for a
        window that starts mid-block. Grows with num_tokens (what the pool cap solves for)."""
        bs = self.block_size
        blocks = -(-num_tokens // bs)
        total = 0
        for group in self.groups:
            if group.window is None:
                total += blocks
            else:
                total += min(blocks, -(-(group.window - 1 + chunk) // bs) + 1)
        return total

    def max_tokens_for_blocks(self, num_blocks: int, chunk: int, limit: int) -> int:
        """The longest sequence, up to `limit` tokens, whose max_blocks_held fits `num_blocks`
        (0 when not even one token fits). Sliding groups stop growing at their window, so a
        model whose every group slides fits any length once its windows fit."""
        if self.max_blocks_held(1, 1) > num_blocks:
            return 0
        lo, hi = 1, limit + 1  # fits(lo); everything past hi - 1 is out of range
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.max_blocks_held(mid, min(chunk, mid)) <= num_blocks:
                lo = mid
            else:
                hi = mid
        return lo
