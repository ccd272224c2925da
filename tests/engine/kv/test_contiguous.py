"""The naive contiguous allocator: as an engine mode, and as the shadow of the paged engine."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_checks import assert_telemetry_matches

from kvscope.engine import LLM, SamplingParams
from kvscope.engine.kv.allocator import KVAllocator, NoFreeBlocksError, PrefixMatch
from kvscope.engine.kv.contiguous import ContiguousAllocator, first_fit
from kvscope.engine.kv.events import EventLog, SequenceAdded, SequenceFinished, StepProgress
from kvscope.engine.kv.paged import PagedAllocator
from kvscope.engine.kv.snapshot import BlockState
from kvscope.engine.kv.telemetry import PoolTelemetry

NO_MATCH = PrefixMatch([], [])


def test_first_fit_finds_the_first_long_enough_run():
    reserved = np.array([1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0], dtype=bool)
    assert first_fit(reserved, 2) == 1
    assert first_fit(reserved, 3) == 4
    assert first_fit(reserved, 4) == 8
    assert first_fit(reserved, 5) is None


def test_a_sequence_reserves_its_maximum_length_at_admission():
    bm = ContiguousAllocator(num_blocks=10, block_size=4, max_seq_len=16)
    assert bm.reservation_blocks == 4
    bm.adopt(1, NO_MATCH)
    bm.grow(1, 5)
    assert bm.table(1) == [0, 1]
    assert bm.num_used_blocks == 4  # reserved space is taken even while empty
    bm.adopt(2, NO_MATCH)
    assert not bm.can_adopt(NO_MATCH, 1)  # 2 blocks left, no run of 4
    assert bm.num_free_blocks == 2
    with pytest.raises(NoFreeBlocksError, match="no run of 4"):
        bm.adopt(3, NO_MATCH)
    with pytest.raises(NoFreeBlocksError, match="reservation has 4"):
        bm.grow(1, 17)
    with pytest.raises(ValueError, match="cannot share"):
        bm.fork(1, 4)
    assert bm.free(1) == [0, 1, 2, 3]
    assert bm.can_adopt(NO_MATCH, 1)
    bm.check_invariants()


@pytest.mark.parametrize("allocator", [PagedAllocator, ContiguousAllocator])
def test_both_allocators_implement_the_whole_protocol_themselves(allocator):
    # A member the subclass forgot would silently fall back to the protocol's empty body.
    members = {n for n in vars(KVAllocator) if not n.startswith("_")}
    members |= set(KVAllocator.__annotations__)  # num_blocks, block_size, peak_used_blocks
    assert members >= {"grow", "table", "cached_block_tokens", "num_cached_blocks", "num_blocks"}
    assert KVAllocator in allocator.__mro__  # declared, not just shaped alike
    bm = allocator(8, 4, 16) if allocator is ContiguousAllocator else allocator(8, 4)
    defined_here = set(vars(allocator)) | set(vars(bm))
    assert members <= defined_here, members - defined_here


def test_a_reservation_larger_than_the_pool_is_rejected():
    with pytest.raises(ValueError, match="needs 5 blocks, the pool has 4"):
        ContiguousAllocator(num_blocks=4, block_size=4, max_seq_len=20)


@settings(max_examples=150, deadline=None)
@given(
    num_blocks=st.integers(4, 40),
    reservation=st.integers(1, 4),
    ops=st.lists(
        st.tuples(st.sampled_from(["admit", "grow", "free"]), st.integers(0, 6)), max_size=60
    ),
)
def test_random_operations_keep_the_reservations_exact(num_blocks, reservation, ops):
    events = EventLog()
    telemetry = PoolTelemetry(num_blocks, 4, "contiguous")
    events.subscribe(telemetry)
    bm = ContiguousAllocator(num_blocks, 4, reservation * 4, events)
    lengths: dict[int, int] = {}
    for op, seq in ops:
        if op == "admit" and seq not in lengths:
            events.emit(SequenceAdded, seq, f"r/{seq}", sample=0, num_prompt_tokens=1)
            if bm.can_adopt(NO_MATCH, 1):
                bm.adopt(seq, NO_MATCH)
                lengths[seq] = 0
        elif op == "grow" and seq in lengths and lengths[seq] < reservation * 4:
            lengths[seq] += 1
            bm.grow(seq, lengths[seq])
            events.emit(StepProgress, lens=((seq, lengths[seq], lengths[seq]),))
        elif op == "free" and seq in lengths:
            bm.free(seq)
            events.emit(SequenceFinished, seq_id=seq, reason="stop")
            del lengths[seq]
        bm.check_invariants()
        assert_telemetry_matches(telemetry, bm)
        snap = telemetry.snapshot()
        assert snap.metrics.blocks_reserved + snap.metrics.blocks_used == bm.num_used_blocks
        assert snap.metrics.tokens_stored == sum(lengths.values())


@pytest.fixture(scope="module")
def pools(default_model):
    kwargs = dict(model=default_model, device="cpu", dtype="float32", num_kv_blocks=48)
    paged = LLM(**kwargs, max_model_len=256)
    contiguous = LLM(**kwargs, max_model_len=256, allocator="contiguous")
    return paged, contiguous


def test_contiguous_mode_gives_the_paged_greedy_outputs_with_less_concurrency(pools, chat_prompts):
    paged, contiguous = pools
    prompts = [[{"role": "user", "content": p}] for p in chat_prompts[:5]]
    params = SamplingParams(max_tokens=10, temperature=0.0)
    a = paged.chat(prompts, params)
    b = contiguous.chat(prompts, params)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    # 48 blocks / 16 per 256-token reservation: at most 3 run at once, the rest wait.
    assert contiguous.stats()["peak_num_running"] == 3
    assert paged.stats()["peak_num_running"] == 5
    assert contiguous.stats()["num_preemptions"] == 0
    assert contiguous.stats()["kv_blocks_used"] == 0


def test_contiguous_mode_snapshot_shows_reserved_but_empty_space(pools):
    _, contiguous = pools
    engine = contiguous.engine
    engine.add_request("conv-1/1", "Hello there", SamplingParams(max_tokens=4, n=2, seed=0))
    engine.step()
    snap = engine.kv_snapshot()
    assert snap.allocator == "contiguous"
    assert snap.metrics.blocks_used == 2  # one prompt block per sample, prefilled separately
    assert snap.metrics.blocks_reserved == 2 * 16 - 2
    assert snap.metrics.useful_slot_share < 0.05
    reserved = snap.state == BlockState.RESERVED
    assert set(snap.owner[reserved]) == {s.seq_id for s in snap.sequences}
    assert engine.shadow_snapshot() is None
    while engine.has_unfinished_requests():
        engine.step()
    with pytest.raises(ValueError, match="allocator='paged'"):
        contiguous.beam_search(["Hi"])


def test_the_shadow_makes_requests_wait_that_the_paged_engine_runs(pools, chat_prompts):
    paged, _ = pools
    engine = paged.engine
    for i, p in enumerate(chat_prompts[:6]):
        engine.add_request(
            f"conv-{i}/1",
            engine.apply_chat_template([{"role": "user", "content": p}]),
            SamplingParams(max_tokens=8, temperature=0.0),
        )
    most_waiting = 0
    while engine.has_unfinished_requests():
        engine.step()
        pool, shadow = engine.kv_snapshot(), engine.shadow_snapshot()
        assert shadow.allocator == "contiguous-shadow"
        assert shadow.num_blocks == pool.num_blocks
        assert shadow.metrics.num_running <= 3
        if pool.metrics.num_running == 6:
            assert shadow.metrics.num_would_wait == 3
            assert shadow.metrics.blocks_reserved > 0
            assert shadow.metrics.useful_slot_share < pool.metrics.useful_slot_share
        most_waiting = max(most_waiting, shadow.metrics.num_would_wait)
    assert most_waiting == 3
    final = engine.shadow_snapshot()
    assert final.metrics.blocks_used == final.metrics.blocks_reserved == 0
