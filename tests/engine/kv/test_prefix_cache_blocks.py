"""Prefix caching and copy-on-write in the block manager alone (no model, no tensors).

The safety property behind every test here: a sequence's block table only ever points at blocks
whose K/V were computed for exactly that sequence's tokens, at the same positions, after the same
prefix. The state machine at the end models the pool's contents to check it under random mixes of
admissions (with prefix hits), growth, forks (copy-on-write) and frees.
"""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kv_checks import assert_telemetry_matches

from kvscope.engine.kv.events import (
    EventLog,
    SequenceAdded,
    SequenceFinished,
    StepProgress,
    event_from_json,
    event_to_json,
)
from kvscope.engine.kv.paged import PagedAllocator
from kvscope.engine.kv.prefix_index import PrefixIndex
from kvscope.engine.kv.telemetry import PoolTelemetry


def _cached_bm(num_blocks: int = 8, block_size: int = 4) -> PagedAllocator:
    return PagedAllocator(num_blocks, block_size, enable_prefix_caching=True)


def _admit(bm: PagedAllocator, seq_id: int, tokens: list[int]) -> int:
    """What the scheduler + engine do for a new prompt: match, adopt, grow, compute, cache.
    Returns the number of tokens served from the cache."""
    match = bm.match_prefix(tokens)
    assert bm.can_adopt(match, len(tokens))
    bm.adopt(seq_id, match)
    assert bm.grow(seq_id, len(tokens)) == []
    bm.cache_full_blocks(seq_id, tokens, len(tokens))
    return len(match.block_ids) * bm.block_size


# ---- matching ----------------------------------------------------------------------------------
def test_full_computed_blocks_become_matchable_after_cache_full_blocks():
    bm = _cached_bm()
    tokens = list(range(10, 20))  # 2 full blocks of 4 + 2 tokens
    bm.grow(1, len(tokens))
    query = tokens + [99]
    assert bm.match_prefix(query).block_ids == []  # allocated but not yet computed/cached
    bm.cache_full_blocks(1, tokens, 5)  # only the first block is full of computed tokens
    assert bm.match_prefix(query).block_ids == bm.table(1)[:1]
    bm.cache_full_blocks(1, tokens, 10)
    match = bm.match_prefix(query)
    assert match.block_ids == bm.table(1)[:2]
    assert [bm.blocks[b].token_ids for b in match.block_ids] == [(10, 11, 12, 13), (14, 15, 16, 17)]
    assert bm.blocks[bm.table(1)[2]].block_hash is None  # the partial block is never hashed
    assert bm.num_cached_blocks == 0  # still in use: cached means free *and* hashed
    bm.check_invariants()


def test_match_stops_at_first_mismatch_and_leaves_the_last_token_to_compute():
    bm = _cached_bm(num_blocks=8)
    tokens = list(range(12))  # exactly 3 full blocks
    _admit(bm, 1, tokens)
    table = bm.table(1)
    # The whole prompt is cached, but its last token must be computed to have logits.
    assert bm.match_prefix(tokens).block_ids == table[:2]
    assert bm.match_prefix(tokens[:9]).block_ids == table[:2]  # (9 - 1) // 4 == 2
    assert bm.match_prefix(tokens[:8]).block_ids == table[:1]  # (8 - 1) // 4 == 1
    assert bm.match_prefix(tokens[:1]).block_ids == []
    assert bm.match_prefix(tokens + [50]).block_ids == table
    # A mismatch in block 1 stops the match there, even though block 2's tokens are identical.
    changed = list(tokens)
    changed[5] = 77
    assert bm.match_prefix(changed + [50]).block_ids == table[:1]
    changed[0] = 77
    assert bm.match_prefix(changed + [50]).block_ids == []
    # Same tokens at a different offset is a different prefix: no match.
    assert bm.match_prefix(tokens[4:] + [50]).block_ids == []
    bm.check_invariants()


def test_disabled_prefix_caching_never_matches():
    bm = PagedAllocator(8, 4, enable_prefix_caching=False)
    tokens = list(range(12))
    assert _admit(bm, 1, tokens) == 0
    assert all(bm.blocks[b].block_hash is None for b in bm.table(1))
    bm.free(1)
    assert bm.num_cached_blocks == 0 and bm.hash_to_block == {}
    assert _admit(bm, 2, tokens + [1]) == 0
    bm.check_invariants()


# ---- cached free blocks ------------------------------------------------------------------------
def test_freed_hashed_blocks_stay_cached_and_are_revived_by_adopt():
    bm = _cached_bm(num_blocks=8)
    tokens = list(range(13))  # 3 full blocks + 1 token
    _admit(bm, 1, tokens)
    table = bm.table(1)
    full = table[:3]
    assert sorted(bm.free(1)) == sorted(table)
    assert bm.num_cached_blocks == 3 and bm.num_free_blocks == 8 and bm.num_used_blocks == 0
    bm.check_invariants()

    match = bm.match_prefix(tokens)
    assert match.block_ids == full
    assert bm.can_adopt(match, len(tokens))
    bm.adopt(2, match)
    assert bm.table(2) == full
    for b in full:
        assert bm.blocks[b].ref_count == 1
        assert b not in bm._free_cached and b not in bm._free_plain
    assert bm.num_cached_blocks == 0 and bm.num_free_blocks == 5
    bm.grow(2, len(tokens))
    assert len(bm.table(2)) == 4
    bm.check_invariants()

    # A live sequence's cached blocks are shared by a new one with the same prefix (ref 2).
    bm.cache_full_blocks(2, tokens, len(tokens))
    assert _admit(bm, 3, tokens[:9]) == 8
    assert [bm.blocks[b].ref_count for b in full] == [2, 2, 1]
    bm.check_invariants()


def test_can_adopt_counts_revived_blocks_against_free_space():
    bm = _cached_bm(num_blocks=4)
    tokens = list(range(12))
    _admit(bm, 1, tokens)
    bm.free(1)  # 3 cached + 1 plain free
    match = bm.match_prefix(tokens + [1, 2, 3, 4, 5])  # 3 blocks hit, 17 tokens need 5 blocks
    assert len(match.block_ids) == 3
    assert bm.can_adopt(match, 16)  # 3 revived + 1 new == 4 free
    assert not bm.can_adopt(match, 17)  # 3 revived + 2 new > 4 free


def test_allocation_prefers_plain_blocks_then_evicts_least_recently_freed():
    bm = _cached_bm(num_blocks=6)
    a, b = [1] * 8, [2] * 8
    _admit(bm, 1, a)
    _admit(bm, 2, b)
    a_blocks, b_blocks = bm.table(1), bm.table(2)
    bm.free(1)  # tail first: a[1] then a[0]
    bm.free(2)
    assert list(bm._free_cached) == [a_blocks[1], a_blocks[0], b_blocks[1], b_blocks[0]]
    assert bm.num_cached_blocks == 4 and len(bm._free_plain) == 2

    # Reviving a's prefix and freeing it again makes it the most recently freed.
    assert _admit(bm, 3, a + [7]) == 8
    bm.free(3)
    assert list(bm._free_cached) == [b_blocks[1], b_blocks[0], a_blocks[1], a_blocks[0]]
    assert len(bm._free_plain) == 2 and bm.num_evictions == 0

    bm.grow(4, 8)  # the two plain blocks go first: nothing evicted
    assert bm.num_evictions == 0 and bm.num_cached_blocks == 4
    assert not set(bm.table(4)) & set(a_blocks + b_blocks)

    b_tail_hash = bm.blocks[b_blocks[1]].block_hash
    bm.grow(4, 9)  # evicts the least recently freed cached block: b's tail
    assert bm.table(4)[-1] == b_blocks[1]
    assert bm.num_evictions == 1 and bm.num_cached_blocks == 3
    assert b_tail_hash not in bm.hash_to_block
    assert bm.blocks[b_blocks[1]].block_hash is None and bm.blocks[b_blocks[1]].token_ids is None
    assert bm.match_prefix(b + [0]).block_ids == b_blocks[:1]  # b's head still hits
    assert bm.match_prefix(a + [0]).block_ids == a_blocks
    bm.check_invariants()

    bm.grow(4, 13)  # then b's head, then a's tail, then a's head
    bm.grow(4, 17)
    assert bm.table(4)[-2:] == [b_blocks[0], a_blocks[1]] and bm.num_evictions == 3
    assert bm.match_prefix(b + [0]).block_ids == []
    assert bm.match_prefix(a + [0]).block_ids == a_blocks[:1]
    bm.grow(4, 21)
    assert bm.table(4)[-1] == a_blocks[0] and bm.num_evictions == 4
    assert bm.num_cached_blocks == 0 and bm.hash_to_block == {}
    bm.check_invariants()


# ---- hash collisions ---------------------------------------------------------------------------
@pytest.fixture
def colliding(monkeypatch):
    """Every block hashes to the same value: only the stored tokens can tell blocks apart."""
    monkeypatch.setattr(PrefixIndex, "hash_block", lambda self, parent, tokens: 42)
    return _cached_bm(num_blocks=8)


def test_hash_collision_never_matches_different_tokens(colliding):
    bm = colliding
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    _admit(bm, 1, tokens)
    assert bm.hash_to_block == {42: bm.table(1)[0]}  # the second block's hash was taken
    assert bm.match_prefix([9, 9, 9, 9, 9]).block_ids == []
    assert bm.match_prefix(tokens + [0]).block_ids == bm.table(1)[:1]
    match = bm.match_prefix([5, 6, 7, 8, 1, 2, 3, 4, 0])
    assert match.block_ids == []
    bm.free(1)
    assert bm.match_prefix([5, 6, 7, 8, 0]).block_ids == []
    bm.check_invariants()


def test_hash_collision_never_serves_a_block_at_another_position(colliding):
    # A hit compares the block's parent hash as well as its tokens (engine/kv/prefix_index.py,
    # lookup): under a hash collision a block cached for positions 0-3 must not be served for
    # positions 4-7 that hold the same tokens, its K/V (rotary positions, attention over another
    # prefix) are wrong there, and the table would map the block twice.
    bm = colliding
    _admit(bm, 1, [1, 2, 3, 4])
    bm.free(1)
    match = bm.match_prefix([1, 2, 3, 4, 1, 2, 3, 4, 0])
    assert len(match.block_ids) <= 1, f"block reused at another position: {match.block_ids}"


# ---- fork and copy-on-write --------------------------------------------------------------------
def test_fork_shares_blocks_and_a_write_into_a_shared_partial_block_copies_once():
    bm = _cached_bm(num_blocks=8)
    bm.grow(1, 6)  # block 0 full, block 1 holds 2 tokens
    bm.fork(1, 2)
    assert bm.table(2) == bm.table(1)
    assert [bm.blocks[b].ref_count for b in bm.table(1)] == [2, 2]
    assert bm.num_used_blocks == 2
    bm.check_invariants()

    shared_full, shared_partial = bm.table(1)
    copies = bm.grow(1, 7, write_from=6)  # parent writes position 6 into the shared block
    assert len(copies) == 1
    src, dst = copies[0]
    assert src == shared_partial and bm.table(1) == [shared_full, dst]
    assert bm.blocks[shared_partial].ref_count == 1 and bm.blocks[dst].ref_count == 1
    assert bm.blocks[shared_full].ref_count == 2  # full blocks are never copied
    assert bm.grow(2, 7, write_from=6) == []  # the child is now the sole owner: write in place
    assert bm.table(2) == [shared_full, shared_partial]
    assert bm.num_cow_copies == 1
    bm.check_invariants()


def test_no_copy_when_the_write_starts_a_new_block():
    bm = _cached_bm(num_blocks=8)
    bm.grow(1, 8)  # two full blocks
    bm.fork(1, 2)
    assert bm.grow(1, 9, write_from=8) == []
    assert bm.grow(2, 12, write_from=8) == []
    assert bm.table(1)[:2] == bm.table(2)[:2] and bm.table(1)[2] != bm.table(2)[2]
    assert [bm.blocks[b].ref_count for b in bm.table(1)] == [2, 2, 1]
    assert bm.num_cow_copies == 0
    bm.check_invariants()


def test_copy_on_write_needs_a_free_block():
    bm = _cached_bm(num_blocks=2)
    bm.grow(1, 6)
    bm.fork(1, 2)
    assert not bm.can_grow(1, 7, write_from=6)  # no room for the private copy
    assert bm.can_grow(1, 7)  # without a write into the shared block it fits
    bm.free(2)
    assert bm.can_grow(1, 7, write_from=6) and bm.grow(1, 7, write_from=6) == []
    bm.check_invariants()


# ---- invariant checker -------------------------------------------------------------------------
def test_invariant_check_catches_a_corrupted_hash_map():
    bm = _cached_bm(num_blocks=8)
    _admit(bm, 1, list(range(9)))
    first = bm.table(1)[0]
    h = bm.blocks[first].block_hash
    bm.check_invariants()

    bm.hash_to_block[h] = bm.table(1)[1]
    with pytest.raises(AssertionError, match="unmapped"):
        bm.check_invariants()
    bm.hash_to_block[h] = first

    bm.hash_to_block[12345] = first
    with pytest.raises(AssertionError, match="hash map points"):
        bm.check_invariants()
    del bm.hash_to_block[12345]

    del bm.hash_to_block[h]
    with pytest.raises(AssertionError, match="unmapped"):
        bm.check_invariants()
    bm.hash_to_block[h] = first
    bm.check_invariants()


def test_invariant_check_catches_a_hashed_block_on_the_plain_free_list():
    bm = _cached_bm(num_blocks=4)
    _admit(bm, 1, list(range(5)))
    bm.free(1)
    cached = next(iter(bm._free_cached))
    del bm._free_cached[cached]
    bm._free_plain[cached] = None
    with pytest.raises(AssertionError, match="plain free block"):
        bm.check_invariants()


# ---- random operations against a model of the pool's contents ------------------------------------
ALPHABET = st.sampled_from([0, 1, 2])  # tiny, so prefixes (and whole blocks) collide often
MAX_LEN = 40


class PrefixCacheMachine(RuleBasedStateMachine):
    """Sequences start with prefix hits, grow, fork and free; the pool must never serve KV
    computed for other tokens.

    `content[block][slot]` models the K/V in a slot as the whole prefix it was computed from
    (tokens[: position + 1]): K/V depend on the position and on every earlier token."""

    @initialize(num_blocks=st.integers(3, 16), block_size=st.sampled_from([1, 2, 4]))
    def setup(self, num_blocks, block_size):
        self.events = EventLog()
        self.telemetry = PoolTelemetry(num_blocks, block_size)
        self.events.subscribe(self.telemetry)
        # A second observer fed through the JSON form of every event: what a replay sees.
        self.replayed = PoolTelemetry(num_blocks, block_size)
        self.events.subscribe(lambda e: self.replayed(event_from_json(event_to_json(e))))
        self.bm = PagedAllocator(
            num_blocks, block_size, enable_prefix_caching=True, events=self.events
        )
        self.bs = block_size
        self.seqs: dict[int, list[int]] = {}  # every token of a sequence is computed here
        self.content: dict[int, list[tuple[int, ...] | None]] = {}
        self.next_id = 0

    def _write(self, seq_id: int, start: int) -> None:
        tokens, table = self.seqs[seq_id], self.bm.table(seq_id)
        for p in range(start, len(tokens)):
            block = self.content.setdefault(table[p // self.bs], [None] * self.bs)
            block[p % self.bs] = tuple(tokens[: p + 1])
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
        assert len(match.block_ids) <= (len(tokens) - 1) // self.bs
        for i, b in enumerate(match.block_ids):
            assert bm.blocks[b].token_ids == tuple(tokens[i * self.bs : (i + 1) * self.bs])
        if not bm.can_adopt(match, len(tokens)):
            return
        seq_id, self.next_id = self.next_id, self.next_id + 1
        self._add(seq_id, len(tokens))
        bm.adopt(seq_id, match)
        assert bm.grow(seq_id, len(tokens)) == []
        self.seqs[seq_id] = list(tokens)
        self._write(seq_id, len(match.block_ids) * self.bs)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), new=st.lists(ALPHABET, min_size=1, max_size=9))
    def extend(self, data, new):
        bm, seq_id = self.bm, self._pick(data)
        tokens = self.seqs[seq_id]
        if len(tokens) + len(new) > MAX_LEN:
            return
        write_from, total = len(tokens), len(tokens) + len(new)
        table = bm.table(seq_id)
        index = write_from // self.bs
        shared = index < len(table) and bm.blocks[table[index]].ref_count > 1
        if not bm.can_grow(seq_id, total, write_from):
            return
        old_block = table[index] if index < len(table) else None
        copies = bm.grow(seq_id, total, write_from)
        if shared:
            assert len(copies) == 1 and copies[0][0] == old_block
            assert bm.table(seq_id)[index] == copies[0][1]
        else:
            assert copies == []
        for src, dst in copies:
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
        bs = self.bs
        filled = self.telemetry.filled_slots()
        for seq_id, tokens in self.seqs.items():
            for i, b in enumerate(self.bm.table(seq_id)):
                assert filled[b] == min(bs, len(tokens) - i * bs), f"block {b} fill"
        assert self.telemetry.snapshot().equals(self.replayed.snapshot())

    @invariant()
    def bookkeeping_is_exact(self):
        if not hasattr(self, "bm"):
            return
        bm = self.bm
        bm.check_invariants()
        used = {b for s in self.seqs for b in bm.table(s)}
        assert bm.num_used_blocks == len(used)
        assert bm.num_free_blocks + len(used) == bm.num_blocks
        free = set(bm._free_plain) | set(bm._free_cached)
        assert free.isdisjoint(used) and len(free | used) == bm.num_blocks
        assert bm.num_cached_blocks == sum(bm.blocks[b].block_hash is not None for b in free)

    @invariant()
    def tables_point_at_the_sequences_own_kv(self):
        if not hasattr(self, "bm"):
            return
        bm, bs = self.bm, self.bs
        for seq_id, tokens in self.seqs.items():
            table = bm.table(seq_id)
            assert len(table) == -(-len(tokens) // bs)
            for i, b in enumerate(table[: len(tokens) // bs]):
                if bm.blocks[b].block_hash is not None:
                    assert bm.blocks[b].token_ids == tuple(tokens[i * bs : (i + 1) * bs])
            for p in range(len(tokens)):
                got = self.content[table[p // bs]][p % bs]
                assert got == tuple(tokens[: p + 1]), (
                    f"sequence {seq_id} position {p} reads KV of another prefix"
                )
        # Every cached block, free or not, holds K/V of exactly the tokens its hash claims.
        for b in bm.hash_to_block.values():
            content = self.content[b]
            assert all(c is not None for c in content)
            assert tuple(c[-1] for c in content) == bm.blocks[b].token_ids


TestPrefixCacheMachine = PrefixCacheMachine.TestCase
TestPrefixCacheMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
