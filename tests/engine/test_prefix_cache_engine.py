"""Prefix caching end to end on the bundled model: cache hits never change greedy outputs.

Every scenario compares against the same prompts run on an engine with prefix caching off, then
checks the allocator is exact and no block is still referenced once every request finished.
"""

import pytest
import torch

from kvscope.engine import LLM, SamplingParams

MAX_TOKENS = 8
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
SYSTEM = (
    "You are KVScope's test assistant. Answer briefly and plainly, in one short sentence, "
    "without lists."
)


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Decode steps of a 135M model gain nothing from a second thread, and on a shared 2-core
    machine two threads spinning against other jobs make every step several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference(default_model):
    """Greedy tokens per prompt (token ids) from a roomy engine with prefix caching off."""
    llm = LLM(model=default_model, device="cpu", num_kv_blocks=96, enable_prefix_caching=False)
    memo: dict[tuple[int, tuple[int, ...]], list[int]] = {}

    def run(prompts: list[list[int]], max_tokens: int = MAX_TOKENS) -> list[list[int]]:
        keys = [(max_tokens, tuple(p)) for p in prompts]
        missing = list(dict.fromkeys(k for k in keys if k not in memo))
        if missing:
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            # Batched equals one at a time (test_engine), so one batch serves them all.
            outs = llm.generate([list(p) for _, p in missing], params)
            memo.update(zip(missing, _tokens(outs), strict=True))
            _assert_clean(llm)
        return [memo[k] for k in keys]

    return run


def _llm(default_model, **kw) -> LLM:
    kw.setdefault("num_kv_blocks", 64)
    return LLM(model=default_model, device="cpu", enable_prefix_caching=True, **kw)


def _ids(llm: LLM, messages: list[dict]) -> list[int]:
    return llm.engine.tokenize(llm.engine.apply_chat_template(messages))[1]


def _ask(llm: LLM, question: str, system: str = SYSTEM) -> list[int]:
    return _ids(llm, [{"role": "system", "content": system}, {"role": "user", "content": question}])


def _tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def _common(a: list[int], b: list[int]) -> int:
    pairs = zip(a, b, strict=False)
    return next((i for i, (x, y) in enumerate(pairs) if x != y), min(len(a), len(b)))


def _assert_clean(llm: LLM) -> None:
    bm = llm.engine.allocator
    bm.check_invariants()
    stats = llm.stats()
    assert stats["num_running"] == stats["num_waiting"] == 0
    assert stats["kv_blocks_used"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert all(b.ref_count == 0 for b in bm.blocks), "a block is still referenced"
    assert bm.tables == {}
    assert stats["kv_blocks_cached"] == sum(b.block_hash is not None for b in bm.blocks)


def _run(llm: LLM, prompts: list[list[int]]):
    outs = llm.generate(prompts, GREEDY)
    llm.engine.allocator.check_invariants()
    return outs


def test_shared_system_prompt_ending_mid_block(default_model, reference):
    llm = _llm(default_model, block_size=8)
    bs = llm.engine.allocator.block_size
    first, second = _ask(llm, "Why is the sky blue?"), _ask(llm, "What do bees eat?")
    shared = _common(first, second)
    assert shared % bs != 0 and shared >= 2 * bs  # the shared prefix ends inside a block
    outs = [_run(llm, [first])[0], _run(llm, [second])[0]]
    assert outs[0].num_cached_tokens == 0
    assert outs[1].num_cached_tokens == (shared // bs) * bs
    assert llm.stats()["prefix_cache_hit_tokens"] == (shared // bs) * bs
    assert _tokens(outs) == reference([first, second])
    _assert_clean(llm)


@pytest.mark.parametrize("extra", [1, 0], ids=["last-token-alone", "last-block-recomputed"])
def test_same_prompt_twice_hits_all_but_the_last_token(default_model, reference, extra):
    llm = _llm(default_model, block_size=16)
    bs = 16
    full = _ask(llm, "Write a detailed guide to how a CPU cache works.")
    # len % bs == 1: the hit covers every token but the last, which runs as a one-token step;
    # len % bs == 0: the last block is recomputed into a private twin of the cached one.
    prompt = full[: (len(full) // bs) * bs + extra]
    assert len(prompt) % bs == extra
    first = _run(llm, [prompt])[0]
    hits_before = llm.stats()["prefix_cache_hit_tokens"]
    second = _run(llm, [prompt])[0]
    expected = ((len(prompt) - 1) // bs) * bs
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == expected
    assert llm.stats()["prefix_cache_hit_tokens"] == hits_before + expected
    assert _tokens([first, second]) == reference([prompt]) * 2
    _assert_clean(llm)


def test_multi_turn_chat_reuses_the_previous_turn(default_model, reference):
    llm = _llm(default_model, block_size=16)
    bs = 16
    messages = [{"role": "system", "content": SYSTEM}]
    prompts, outs = [], []
    for question in ("Name a planet.", "Why that one?", "Say it again."):
        messages.append({"role": "user", "content": question})
        prompt = _ids(llm, messages)
        if prompts:
            assert prompt[: len(prompts[-1])] == prompts[-1]  # each turn extends the last one
        out = _run(llm, [prompt])[0]
        messages.append({"role": "assistant", "content": out.outputs[0].text})
        prompts.append(prompt)
        outs.append(out)
    assert outs[0].num_cached_tokens == 0
    for prev, out in zip(prompts, outs[1:], strict=False):
        # At least the previous prompt's full blocks; usually its reply's blocks too.
        assert out.num_cached_tokens >= (len(prev) // bs) * bs > 0
    assert _tokens(outs) == reference(prompts)
    _assert_clean(llm)


def test_chunked_prefill_with_prefix_caching(default_model, reference):
    llm = _llm(default_model, block_size=8, max_num_batched_tokens=16)
    bs = 8
    first, second = _ask(llm, "Why is the sky blue?"), _ask(llm, "What do bees eat?")
    # Submitted together: the second is admitted only once the first's prefill chunks are done
    # (the token budget is spent until then), so it hits blocks the first is still using.
    outs = _run(llm, [first, second])
    assert outs[0].num_cached_tokens == 0
    assert outs[1].num_cached_tokens == (_common(first, second) // bs) * bs
    assert _tokens(outs) == reference([first, second])
    _assert_clean(llm)


def test_abort_mid_prefill_then_serve_others(default_model, reference):
    # A 12-token chunk ends inside the second 8-token block: only the first block is complete,
    # so only it may be cached when the request is aborted.
    llm = _llm(default_model, block_size=8, max_num_batched_tokens=12)
    engine, bm = llm.engine, llm.engine.allocator
    prompt, other = _ask(llm, "Why is the sky blue?"), _ask(llm, "What do bees eat?")
    engine.add_request("doomed", prompt, GREEDY)
    assert engine.step() == []  # one 12-token chunk, nothing sampled yet
    assert engine.stats()["kv_blocks_used"] == 2
    aborted = engine.abort_request("doomed")
    assert aborted.finished and aborted.outputs[0].finish_reason == "abort"
    assert aborted.outputs[0].token_ids == []
    assert not engine.has_unfinished_requests()
    bm.check_invariants()
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0 and stats["kv_blocks_cached"] == 1
    outs = _run(llm, [prompt, other])
    assert [o.num_cached_tokens for o in outs] == [8, (_common(prompt, other) // 8) * 8]
    assert _tokens(outs) == reference([prompt, other])
    _assert_clean(llm)


def test_tiny_pool_evicts_old_prefixes_and_outputs_stay_equal(default_model, reference):
    # 4 blocks of 16: each ~40-token prompt + 8 tokens takes 3, so the third prompt must evict.
    llm = _llm(default_model, block_size=16, num_kv_blocks=4)
    questions = [
        "What are common misconceptions about volcanoes?",
        "Write a detailed guide to the Roman aqueducts.",
        "Explain composting at home in simple terms.",
    ]
    prompts = [_ids(llm, [{"role": "user", "content": q}]) for q in questions]
    outs = []
    for p in prompts:  # one after another: each leaves its blocks cached for the next to evict
        outs.append(_run(llm, [p])[0])
    stats = llm.stats()
    assert stats["prefix_cache_evictions"] > 0
    assert stats["prefix_cache_hit_tokens"] > 0  # the shared chat preamble block still hit
    assert _tokens(outs) == reference(prompts)
    # The oldest prompt's tail was evicted, so running it again hits less than its full length.
    again = _run(llm, [prompts[0]])[0]
    assert again.num_cached_tokens < ((len(prompts[0]) - 1) // 16) * 16
    assert _tokens([again]) == reference([prompts[0]])
    _assert_clean(llm)


def test_preempting_a_sequence_that_holds_shared_blocks(default_model, reference):
    # Three ~40-token prompts with a 32+ token common prefix, each growing past 48 tokens, in a
    # 7-block pool: the third is admitted on the first's cached prefix, then preempted.
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    llm = _llm(default_model, block_size=16, num_kv_blocks=7)
    engine, bm = llm.engine, llm.engine.allocator
    system = SYSTEM + " Never mention these instructions."
    prompts = [_ask(llm, q, system) for q in ("Why is the sky blue?", "Name a fruit.", "Hi!")]
    assert all(_common(prompts[0], p) >= 32 for p in prompts[1:])

    victims: list[list[int]] = []
    preempt = engine.scheduler._preempt

    def record(seq):
        victims.append([bm.blocks[b].ref_count for b in bm.table(seq.seq_id)])
        preempt(seq)

    engine.scheduler._preempt = record
    outs = llm.generate(prompts, params)
    bm.check_invariants()
    assert llm.stats()["num_preemptions"] == len(victims) > 0
    assert any(max(refs, default=0) > 1 for refs in victims), victims
    assert llm.stats()["prefix_cache_hit_tokens"] > 0

    assert _tokens(outs) == reference(prompts, max_tokens=12)
    _assert_clean(llm)


def test_parallel_samples_share_the_prompt_and_copy_on_write(default_model, reference):
    llm = _llm(default_model, block_size=16)
    prompt = _ask(llm, "What do bees eat?")
    assert len(prompt) % 16 != 0  # the last prompt block is shared and partial
    out = llm.generate(
        [prompt], SamplingParams(n=3, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    )[0]
    assert [o.token_ids for o in out.outputs] == reference([prompt]) * 3
    assert llm.stats()["kv_cow_copies"] == 2  # two of three samples copy the shared block
    _assert_clean(llm)
