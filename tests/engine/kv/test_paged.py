"""Block manager: exact bookkeeping under random operation sequences (hypothesis)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.engine.kv.allocator import NoFreeBlocksError
from kvscope.engine.kv.paged import PagedAllocator


def test_blocks_are_allocated_one_at_a_time_as_a_sequence_grows():
    bm = PagedAllocator(num_blocks=8, block_size=4)
    bm.grow(1, 4)
    assert bm.table(1) == [0]
    bm.grow(1, 4)  # still fits in the first block
    assert bm.table(1) == [0]
    bm.grow(1, 5)
    assert bm.table(1) == [0, 1]
    assert bm.num_used_blocks == 2
    bm.check_invariants()


def test_free_returns_every_block():
    bm = PagedAllocator(num_blocks=8, block_size=4)
    bm.grow(1, 10)
    bm.grow(2, 3)
    assert sorted(bm.free(1)) == [0, 1, 2]
    assert bm.num_free_blocks == 7
    bm.free(2)
    assert bm.num_free_blocks == 8
    bm.check_invariants()


def test_grow_past_capacity_raises_and_changes_nothing():
    bm = PagedAllocator(num_blocks=2, block_size=4)
    bm.grow(1, 4)
    with pytest.raises(NoFreeBlocksError, match="needs 2 blocks, only 1 free"):
        bm.grow(2, 8)
    assert bm.table(2) == []
    bm.check_invariants()


def test_invariant_check_catches_a_corrupted_ref_count():
    bm = PagedAllocator(num_blocks=4, block_size=4)
    bm.grow(1, 4)
    bm.blocks[0].ref_count = 2
    with pytest.raises(AssertionError, match="ref_count 2 but 1 table references"):
        bm.check_invariants()


ops = st.lists(
    st.tuples(st.sampled_from(["grow", "free"]), st.integers(0, 5), st.integers(1, 70)),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(num_blocks=st.integers(1, 24), block_size=st.sampled_from([1, 4, 16]), ops=ops)
def test_random_operations_keep_invariants(num_blocks, block_size, ops):
    bm = PagedAllocator(num_blocks, block_size)
    lengths: dict[int, int] = {}
    for op, seq, tokens in ops:
        if op == "grow":
            target = lengths.get(seq, 0) + tokens
            if bm.can_grow(seq, target):
                bm.grow(seq, target)
                lengths[seq] = target
            else:
                with pytest.raises(NoFreeBlocksError):
                    bm.grow(seq, target)
        else:
            bm.free(seq)
            lengths.pop(seq, None)
        bm.check_invariants()
        for s, n in lengths.items():
            assert len(bm.table(s)) == -(-n // block_size)
    for s in list(lengths):
        bm.free(s)
    assert bm.num_free_blocks == num_blocks
    bm.check_invariants()
