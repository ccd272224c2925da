"""KV groups in the block manager: per-group tables over one pool, sliding groups giving back the
blocks that fell out of the window, prefix hits valid for every group, exact bookkeeping under
random operations (hypothesis), and the telemetry (live and through JSON) mirroring it all."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kv_checks import assert_telemetry_matches

from kvscope.engine.kv.allocator import NULL_BLOCK
from kvscope.engine.kv.events import (
    EventLog,
    SequenceAdded,
    SequenceFinished,
    StepProgress,
    event_from_json,
    event_to_json,
)
from kvscope.engine.kv.layout import KVLayout
from kvscope.engine.kv.paged import PagedAllocator
from kvscope.engine.kv.telemetry import PoolTelemetry

GEMMA3_270M = (512,) * 5 + (None,) + (512,) * 5 + (None,) + (512,) * 5 + (None,)


def test_layouts_group_layers_by_window():
    llama = KVLayout.for_windows((None,) * 4, 16)
    assert llama.num_groups == 1 and llama.group_size == 4 and llama.windows == (None,)
    mistral = KVLayout.for_windows((4096,) * 32, 16)
    assert mistral.windows == (4096,) and mistral.group_size == 32
    gemma = KVLayout.for_windows(GEMMA3_270M, 16)
    # 15 sliding, 3 full: groups of 3 (vLLM's equal-size groups), the full group first.
    assert gemma.group_size == 3
    assert gemma.windows == (None, 512, 512, 512, 512, 512)
    assert gemma.groups[0].layers == (5, 11, 17)
    placed = gemma.placement()
    assert sorted(placed) == sorted({(g, s) for g in range(6) for s in range(3)})
    assert placed[5] == (0, 0) and placed[0] == (1, 0)
    # Windows ignored: one group, never releasing.
    assert KVLayout.for_windows(GEMMA3_270M, 16, honour_windows=False).windows == (None,)


def test_layout_with_uneven_kinds_leaves_a_smaller_last_group():
    layout = KVLayout.for_windows((8, 8, 8, None, None), 4)
    assert layout.group_size == 2
    assert [g.layers for g in layout.groups] == [(3, 4), (0, 1), (2,)]


def test_held_blocks_of_a_sliding_group_stop_at_the_window():
    layout = KVLayout.for_windows((32, 32), 8)
    assert layout.max_blocks_held(10_000, 1) == 4 + 1  # ceil(31 / 8) + 1
    assert layout.max_blocks_held(10_000, 64) == -(-(31 + 64) // 8) + 1
    # Every group slides: any length fits a pool that holds the window.
    assert layout.max_tokens_for_blocks(5, 1, 10**6) == 10**6
    assert layout.max_tokens_for_blocks(4, 1, 10**6) == 32  # 4 blocks: no room to slide
    full = KVLayout.single(2, 8)
    assert full.max_tokens_for_blocks(5, 1, 10**6) == 40


def _grow(bm, seq_id, total, computed):
    bm.release_outside_window(seq_id, computed)
    return bm.grow(seq_id, total, computed)


def test_sliding_group_releases_blocks_as_the_sequence_grows():
    layout = KVLayout.for_windows((None, 8), 4)  # a full group and a window of 8 tokens
    bm = PagedAllocator(64, 4, layout=layout)
    bm.grow(1, 1)
    held = []
    for n in range(1, 60):
        _grow(bm, 1, n + 1, n)
        full, sliding = bm.tables_of(1)
        held.append(sum(b != NULL_BLOCK for b in sliding))
        assert NULL_BLOCK not in full and len(full) == len(sliding) == -(-(n + 1) // 4)
        # What the token at position n reads (n - 8 < j <= n) is still held.
        first_needed = max(0, n - 8 + 1) // 4
        assert all(b != NULL_BLOCK for b in sliding[first_needed:])
        assert all(b == NULL_BLOCK for b in sliding[:first_needed])
        bm.check_invariants()
    assert max(held) == 3 and held[-1] <= 3  # flat at the window, while the full group grows
    assert bm.num_released_blocks == len(bm.tables_of(1)[1]) - held[-1]
    bm.free(1)
    assert bm.num_free_blocks == 64
    bm.check_invariants()


def test_prefix_hit_needs_only_the_window_of_a_sliding_group():
    """A sliding-only model: blocks released early keep their hash; a later prompt with the same
    prefix hits the blocks under its window, the older ones start NULL."""
    layout = KVLayout.for_windows((8, 8), 4)
    bm = PagedAllocator(32, 4, enable_prefix_caching=True, layout=layout)
    tokens = list(range(40))
    bm.grow(1, 1)
    for n in range(1, 40):
        _grow(bm, 1, n + 1, n)
        bm.cache_full_blocks(1, tokens[: n + 1], n)
    bm.cache_full_blocks(1, tokens, 40)
    bm.free(1)
    # 30 tokens: a hit of 7 blocks (28 tokens) needs blocks 5 and 6 (positions 21..27).
    match = bm.match_prefix(tokens[:30])
    assert match.num_blocks == 7
    assert match.block_ids[:5] == [NULL_BLOCK] * 5 and NULL_BLOCK not in match.block_ids[5:]
    bm.adopt(2, match)
    bm.grow(2, 30)
    bm.check_invariants()
    bm.free(2)
    # Evict the cached blocks under that window: the hit shrinks to where a window is whole.
    for b in match.block_ids[5:]:
        del bm._hash_maps[0][bm.blocks[b].block_hash]
        bm._free_cached.pop(b)
        bm._free_plain[b] = None
        bm.blocks[b].block_hash = bm.blocks[b].token_ids = bm.blocks[b].parent_hash = None
    bm.check_invariants()
    shorter = bm.match_prefix(tokens[:30])
    # 5 blocks: position 20 reads 13..20, blocks 3 and 4, still cached.
    assert shorter.num_blocks == 5
    assert shorter.block_ids[:3] == [NULL_BLOCK] * 3


def test_full_group_limits_the_prefix_hit():
    layout = KVLayout.for_windows((None, 8), 4)
    bm = PagedAllocator(64, 4, enable_prefix_caching=True, layout=layout)
    tokens = list(range(24))
    bm.grow(1, 24)
    bm.cache_full_blocks(1, tokens, 24)
    bm.free(1)
    match = bm.match_prefix(tokens + [99])
    assert match.num_blocks == 6
    full, sliding = match.groups
    assert NULL_BLOCK not in full
    assert sliding[:4] == [NULL_BLOCK] * 4  # position 24 reads 17..24: blocks 4 and 5
    # Without the full group's first block there is no hit at all.
    first = full[0]
    del bm._hash_maps[0][bm.blocks[first].block_hash]
    bm.blocks[first].block_hash = None
    bm._free_cached.pop(first)
    bm._free_plain[first] = None
    assert bm.match_prefix(tokens + [99]).num_blocks == 0


def test_invariants_catch_a_hole_and_a_full_group_release():
    layout = KVLayout.for_windows((None, 8), 4)
    bm = PagedAllocator(16, 4, layout=layout)
    bm.grow(1, 16)
    bm.group_tables[1][0][0] = NULL_BLOCK
    with pytest.raises(AssertionError, match="full-attention group 0 released"):
        bm.check_invariants()
    bm = PagedAllocator(16, 4, layout=layout)
    bm.grow(1, 16)
    bm.group_tables[1][1][2] = NULL_BLOCK
    with pytest.raises(AssertionError, match="a hole"):
        bm.check_invariants()


# ---- random operations against a model of the pool's contents ------------------------------
ALPHABET = st.sampled_from([0, 1])
MAX_LEN = 48
LAYOUTS = [(None, 6), (5, 5), (None, None, 9, 9), (3,)]


class GroupedPoolMachine(RuleBasedStateMachine):
    """Sequences start with prefix hits, grow (releasing out-of-window blocks first), fork and
    free, over layouts with and without full groups. `content[block][slot]` models the K/V a
    slot holds as (group, the prefix it was computed from): every block a sequence still holds
    must hold its own K/V, and what the next token's window reads must be held."""

    @initialize(
        num_blocks=st.integers(4, 40),
        block_size=st.sampled_from([1, 2, 4]),
        windows=st.sampled_from(LAYOUTS),
    )
    def setup(self, num_blocks, block_size, windows):
        self.layout = KVLayout.for_windows(windows, block_size)
        self.events = EventLog()
        self.telemetry = PoolTelemetry(num_blocks, block_size, group_windows=self.layout.windows)
        self.events.subscribe(self.telemetry)
        self.replayed = PoolTelemetry(num_blocks, block_size, group_windows=self.layout.windows)
        self.events.subscribe(lambda e: self.replayed(event_from_json(event_to_json(e))))
        self.bm = PagedAllocator(
            num_blocks,
            block_size,
            enable_prefix_caching=True,
            events=self.events,
            layout=self.layout,
        )
        self.bs = block_size
        self.seqs: dict[int, list[int]] = {}
        self.content: dict[int, list[tuple | None]] = {}
        self.next_id = 0

    def _write(self, seq_id: int, start: int) -> None:
        tokens = self.seqs[seq_id]
        for g, table in enumerate(self.bm.tables_of(seq_id)):
            for p in range(start, len(tokens)):
                block = self.content.setdefault(table[p // self.bs], [None] * self.bs)
                block[p % self.bs] = (g, tuple(tokens[: p + 1]))
        self.bm.cache_full_blocks(seq_id, tokens, len(tokens))
        self.events.emit(StepProgress, lens=((seq_id, len(tokens), len(tokens)),))

    def _add(self, seq_id: int, num_tokens: int) -> None:
        self.events.emit(
            SequenceAdded, seq_id, request_id=f"r/{seq_id}", sample=0, num_prompt_tokens=num_tokens
        )

    def _pick(self, data) -> int:
        return data.draw(st.sampled_from(sorted(self.seqs)))

    @rule(tokens=st.lists(ALPHABET, min_size=1, max_size=MAX_LEN // 2))
    def start(self, tokens):
        bm = self.bm
        match = bm.match_prefix(tokens)
        assert match.num_blocks <= (len(tokens) - 1) // self.bs
        for table in match.group_ids(bm.num_groups):
            assert len(table) == match.num_blocks
            for i, b in enumerate(table):
                if b != NULL_BLOCK:
                    assert bm.blocks[b].token_ids == tuple(tokens[i * self.bs : (i + 1) * self.bs])
        if not bm.can_adopt(match, len(tokens)):
            return
        seq_id, self.next_id = self.next_id, self.next_id + 1
        self._add(seq_id, len(tokens))
        bm.adopt(seq_id, match)
        assert bm.grow(seq_id, len(tokens)) == []
        self.seqs[seq_id] = list(tokens)
        self._write(seq_id, match.num_blocks * self.bs)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), new=st.lists(ALPHABET, min_size=1, max_size=9))
    def extend(self, data, new):
        bm, seq_id = self.bm, self._pick(data)
        tokens = self.seqs[seq_id]
        if len(tokens) + len(new) > MAX_LEN:
            return
        write_from, total = len(tokens), len(tokens) + len(new)
        bm.release_outside_window(seq_id, write_from)
        if not bm.can_grow(seq_id, total, write_from):
            return
        for src, dst in bm.grow(seq_id, total, write_from):
            self.content[dst] = list(self.content[src])
        tokens.extend(new)
        self._write(seq_id, write_from)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data):
        parent = self._pick(data)
        child, self.next_id = self.next_id, self.next_id + 1
        self._add(child, len(self.seqs[parent]))
        self.bm.fork(parent, child)
        self.seqs[child] = list(self.seqs[parent])

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        seq_id = self._pick(data)
        self.bm.free(seq_id)
        self.events.emit(SequenceFinished, seq_id=seq_id, reason="stop")
        del self.seqs[seq_id]

    @invariant()
    def telemetry_mirrors_the_pool(self):
        if not hasattr(self, "bm"):
            return
        assert_telemetry_matches(self.telemetry, self.bm)
        assert self.telemetry.snapshot().equals(self.replayed.snapshot())
        self.bm.check_invariants()

    @invariant()
    def held_blocks_hold_the_sequences_own_kv(self):
        if not hasattr(self, "bm"):
            return
        bm, bs = self.bm, self.bs
        for seq_id, tokens in self.seqs.items():
            for g, table in enumerate(bm.tables_of(seq_id)):
                assert len(table) == -(-len(tokens) // bs)
                # What the next token (position len) reads; older blocks may be gone already.
                needed_from = self.layout.first_needed_block(g, len(tokens))
                assert all(b != NULL_BLOCK for b in table[needed_from:]), (seq_id, g, table)
                for p in range(len(tokens)):
                    b = table[p // bs]
                    if b == NULL_BLOCK:
                        continue
                    assert self.content[b][p % bs] == (g, tuple(tokens[: p + 1])), (
                        f"sequence {seq_id} group {g} position {p} reads KV of another prefix"
                    )
        for g, hash_map in enumerate(bm._hash_maps):
            for b in hash_map.values():
                assert all(c is not None and c[0] == g for c in self.content[b])


GroupedPoolMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None
)
test_grouped_pool = GroupedPoolMachine.TestCase
