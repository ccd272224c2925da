"""Scheduler without a model: continuous batching, chunked prefill and preemption bookkeeping."""

from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.engine.kv.events import EventLog, SequencePreempted
from kvscope.engine.kv.paged import PagedAllocator
from kvscope.engine.outputs import RequestMetrics
from kvscope.engine.sampling_params import SamplingParams
from kvscope.engine.scheduler import Scheduler
from kvscope.engine.sequence import Request, Sequence, SequenceStatus


def _seq(prompt_len: int, max_tokens: int = 4) -> Sequence:
    ids = list(range(prompt_len))
    request = Request("r", None, ids, SamplingParams(max_tokens=max_tokens), RequestMetrics(0.0))
    seq = Sequence(request=request, index=0, token_ids=list(ids), detokenizer=None, generator=None)
    request.sequences.append(seq)
    return seq


def _run_step(sched: Scheduler, finished: list[Sequence]) -> list[tuple[Sequence, int]]:
    """Pretend to compute the batch: advance counters and sample one token where due."""
    batch = sched.schedule()
    for seq, n in batch.items:
        seq.num_computed_tokens += n
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(0)
            if seq.num_output_tokens >= seq.request.params.max_tokens:
                sched.finish(seq)
                finished.append(seq)
    return batch.items


def test_long_prompt_is_chunked_and_decodes_keep_running():
    bm = PagedAllocator(64, 16)
    sched = Scheduler(bm, bm.events, max_num_seqs=8, max_batched_tokens=32)
    short = _seq(4, max_tokens=10)
    sched.add(short)
    _run_step(sched, [])
    sched.add(_seq(100))
    for _ in range(4):
        items = _run_step(sched, [])
        # The running chat decodes every step while the long prompt advances in chunks.
        assert items[0] == (short, 1)
        assert sum(n for _, n in items) <= 32
    bm.check_invariants()


def test_newest_sequence_is_preempted_and_requeued_first():
    events = EventLog()
    bm = PagedAllocator(4, 4, events=events)  # 16 slots
    sched = Scheduler(bm, events, max_num_seqs=8, max_batched_tokens=64)
    old, new = _seq(7, max_tokens=20), _seq(7, max_tokens=20)
    sched.add(old)
    sched.add(new)
    finished: list[Sequence] = []
    while new.status is not SequenceStatus.PREEMPTED:
        _run_step(sched, finished)
    assert sched.waiting[0] is new and new.num_computed_tokens == 0
    preempted = [e.seq_id for e in events.recent() if isinstance(e, SequencePreempted)]
    assert preempted == [new.seq_id]
    # Each sample counts its own; its output carries it to vllm:request_num_preemptions.
    assert (new.num_preemptions, old.num_preemptions) == (1, 0)
    assert bm.table(new.seq_id) == []
    bm.check_invariants()


@settings(max_examples=150, deadline=None)
@given(
    num_blocks=st.integers(4, 40),
    block_size=st.sampled_from([4, 16]),
    prompts=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 30)), min_size=1, max_size=12),
    max_num_seqs=st.integers(1, 6),
    budget=st.integers(8, 64),
)
def test_every_request_finishes_and_all_blocks_return(
    num_blocks, block_size, prompts, max_num_seqs, budget
):
    bm = PagedAllocator(num_blocks, block_size)
    sched = Scheduler(bm, bm.events, max_num_seqs, budget)
    pool_tokens = num_blocks * block_size
    seqs = []
    for prompt_len, max_tokens in prompts:
        if prompt_len + 1 > pool_tokens:
            continue  # the engine rejects these at add_request
        # The engine caps a sequence at the pool size; mirror it through max_tokens.
        seq = _seq(prompt_len, min(max_tokens, pool_tokens - prompt_len))
        sched.add(seq)
        seqs.append(seq)
    finished: list[Sequence] = []
    for _ in range(5000):
        if not sched.has_unfinished():
            break
        _run_step(sched, finished)
        bm.check_invariants()
        assert len(sched.running) <= max_num_seqs
        for seq in sched.running:
            assert len(bm.table(seq.seq_id)) * block_size >= seq.num_computed_tokens
    assert not sched.has_unfinished(), "scheduler stalled"
    assert len(finished) == len(seqs)
    assert bm.num_free_blocks == num_blocks


def test_prompt_tokens_beside_decodes_are_capped_and_alone_take_the_budget():
    bm = PagedAllocator(64, 16)
    sched = Scheduler(
        bm, bm.events, max_num_seqs=8, max_batched_tokens=64, prefill_beside_decodes=8
    )
    first = _seq(40, max_tokens=1)
    sched.add(first)
    assert _run_step(sched, []) == [(first, 40)]  # no decodes: the whole budget
    chat = _seq(4, max_tokens=50)
    sched.add(chat)
    _run_step(sched, [])
    a, b = _seq(13), _seq(30)
    sched.add(a)
    sched.add(b)
    items = _run_step(sched, [])
    assert items == [(chat, 1), (a, 8)]  # b waits: a's chunk took the cap
    items = _run_step(sched, [])
    assert items == [(chat, 1), (a, 5), (b, 3)]
    for _ in range(20):
        items = _run_step(sched, [])
        assert sum(n for _, n in items if n > 1) <= 8
