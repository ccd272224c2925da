"""The engine end to end on the bundled model: batching, preemption, chunking, errors, stats."""

import pytest

from kvscope.engine import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts(default_llm, chat_prompts):
    engine = default_llm.engine
    return [engine.apply_chat_template([{"role": "user", "content": p}]) for p in chat_prompts[:4]]


@pytest.fixture(scope="module")
def reference(default_llm, prompts):
    """Each prompt alone, greedy: what every batching/paging variant must reproduce."""
    return [default_llm.generate(p, GREEDY)[0].outputs[0].token_ids for p in prompts]


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def _assert_clean(llm):
    llm.engine.allocator.check_invariants()
    stats = llm.stats()
    assert stats["kv_blocks_used"] == 0 and stats["num_running"] == stats["num_waiting"] == 0


def test_batched_equals_one_at_a_time(default_llm, prompts, reference):
    assert _tokens(default_llm.generate(prompts, GREEDY)) == reference
    _assert_clean(default_llm)


def test_requests_join_and_leave_a_running_batch(default_llm, prompts, reference):
    engine = default_llm.engine
    engine.add_request("early", prompts[0], SamplingParams(max_tokens=3, temperature=0.0))
    engine.add_request("long", prompts[1], GREEDY)
    engine.step()
    engine.step()
    engine.add_request("late", prompts[2], GREEDY)  # joins while the others decode
    final, running_counts = {}, []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        running_counts.append(engine.stats()["num_running"])
    assert final["early"].outputs[0].token_ids == reference[0][:3]
    assert final["long"].outputs[0].token_ids == reference[1]
    assert final["late"].outputs[0].token_ids == reference[2]
    assert max(running_counts) == 2  # "early" left as soon as it finished
    _assert_clean(default_llm)


@pytest.mark.parametrize("block_size", [8, 32])
def test_block_size_does_not_change_outputs(default_model, prompts, reference, block_size):
    llm = LLM(model=default_model, device="cpu", block_size=block_size, num_kv_blocks=256)
    assert _tokens(llm.generate(prompts, GREEDY)) == reference
    _assert_clean(llm)


def test_chunked_prefill_gives_the_same_tokens(default_model, prompts, reference):
    llm = LLM(model=default_model, device="cpu", num_kv_blocks=128, max_num_batched_tokens=16)
    assert _tokens(llm.generate(prompts, GREEDY)) == reference
    _assert_clean(llm)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_preemption_by_recompute_keeps_outputs(default_model, prompts, reference, prefix_caching):
    # Four ~40-token prompts growing by 12 need 16 blocks of 16; six force preemptions.
    llm = LLM(
        model=default_model,
        device="cpu",
        block_size=16,
        num_kv_blocks=6,
        enable_prefix_caching=prefix_caching,
    )
    outs = llm.generate(prompts, GREEDY)
    assert llm.stats()["num_preemptions"] > 0
    assert _tokens(outs) == reference
    _assert_clean(llm)


def test_sequence_is_capped_at_the_pool_size(default_model, prompts):
    llm = LLM(model=default_model, device="cpu", block_size=16, num_kv_blocks=4)
    out = llm.generate(prompts[0], SamplingParams(max_tokens=200, ignore_eos=True))[0]
    assert out.outputs[0].finish_reason == "length"
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 4 * 16
    _assert_clean(llm)


def test_abort_frees_blocks_and_others_continue(default_llm, prompts, reference):
    engine = default_llm.engine
    engine.add_request("keep", prompts[0], GREEDY)
    engine.add_request("drop", prompts[1], GREEDY)
    engine.step()
    used_before = engine.stats()["kv_blocks_used"]
    aborted = engine.abort_request("drop")
    assert aborted.finished and aborted.outputs[0].finish_reason == "abort"
    assert engine.stats()["kv_blocks_used"] < used_before
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            final = out
    assert final.request_id == "keep" and final.outputs[0].token_ids == reference[0]
    assert engine.abort_request("no-such-request") is None
    _assert_clean(default_llm)


def test_bad_requests_raise_and_the_engine_keeps_serving(default_model, prompts, reference):
    llm = LLM(model=default_model, device="cpu", max_model_len=64, num_kv_blocks=3)
    assert 36 < len(llm.engine.tokenize(prompts[0])[1]) < 48
    with pytest.raises(ValueError, match="max_model_len 64"):
        llm.generate([list(range(100, 164))], GREEDY)
    with pytest.raises(ValueError, match=r"KV pool.*48 tokens \(3 blocks of 16\)"):
        llm.generate([list(range(100, 150))], GREEDY)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate([""], GREEDY)
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 49152\)"):
        llm.generate([[1, 2, 10**6]], GREEDY)
    # A batch with one bad prompt adds nothing: the good one before it is rolled back.
    with pytest.raises(ValueError):
        llm.generate(["hello", ""], GREEDY)
    _assert_clean(llm)
    engine = llm.engine
    engine.add_request("dup", "hello", GREEDY)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("dup", "hello", GREEDY)
    engine.abort_request("dup")
    # Still serving: the same tokens as a roomy engine, up to the 48 slots this pool has.
    out = llm.generate(prompts[0], GREEDY)[0]
    room = 48 - len(out.prompt_token_ids)
    assert out.outputs[0].token_ids == reference[0][:room]
    _assert_clean(llm)


def test_stop_conditions(default_llm, prompts, reference):
    ref = reference[0]
    by_id = default_llm.generate(prompts[0], SamplingParams(temperature=0, stop_token_ids=[ref[4]]))
    out = by_id[0].outputs[0]
    assert out.token_ids == ref[: ref.index(ref[4]) + 1]
    assert out.finish_reason == "stop" and out.stop_reason == ref[4]

    full_text = default_llm.generate(prompts[0], GREEDY)[0].outputs[0].text
    stop = full_text[10:14]
    cut = default_llm.generate(prompts[0], SamplingParams(temperature=0, stop=[stop]))[0]
    assert cut.outputs[0].text == full_text[: full_text.index(stop)]
    assert cut.outputs[0].stop_reason == stop

    question = [{"role": "user", "content": "What is the capital of France?"}]
    eos_run = default_llm.chat(question, SamplingParams(temperature=0, max_tokens=64))[0]
    assert eos_run.outputs[0].finish_reason == "stop"  # the model ends its turn by itself
    assert eos_run.outputs[0].token_ids[-1] in default_llm.engine.eos_token_ids
    _assert_clean(default_llm)


def test_seeded_sampling_is_reproducible_whatever_the_batch(default_llm, prompts):
    params = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
    alone = default_llm.generate(prompts[0], params)[0].outputs[0].token_ids
    batched = default_llm.generate(prompts, [params, GREEDY, GREEDY, params])
    assert batched[0].outputs[0].token_ids == alone
    assert batched[3].outputs[0].token_ids != alone or prompts[3] == prompts[0]


def test_n_samples_and_logprobs(default_llm, prompts):
    params = SamplingParams(n=3, max_tokens=8, seed=1, logprobs=3, ignore_eos=True)
    out = default_llm.generate(prompts[0], params)[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1  # independent random streams
    for o in out.outputs:
        assert len(o.logprobs) == 8
        for token, top in zip(o.token_ids, o.logprobs, strict=True):
            assert token in top and len(top) >= 3
    _assert_clean(default_llm)


def test_metrics_and_stats(default_llm, prompts):
    out = default_llm.generate(prompts[0], SamplingParams(max_tokens=4))[0]
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
    stats = default_llm.stats()
    for key in (
        "kv_block_size",
        "kv_blocks_total",
        "kv_blocks_used",
        "kv_blocks_free",
        "kv_blocks_cached",
        "kv_tokens_stored",
        "num_running",
        "num_waiting",
        "num_preemptions",
        "peak_num_running",
        "prefix_cache_query_tokens",
        "prefix_cache_hit_tokens",
    ):
        assert isinstance(stats[key], int), key
    assert stats["kv_blocks_used"] + stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_transformers_does_not_mistake_our_kernels_package():
    from transformers.utils import import_utils

    from kvscope import kernels

    assert kernels.__file__.endswith("kernels/__init__.py")
    if import_utils.is_kernels_available():  # Hugging Face's, installed beside ours
        import kernels as hf_kernels

        assert hf_kernels.__file__ != kernels.__file__


def test_a_request_whose_sampling_fails_fails_alone(default_model, monkeypatch):
    """One request's sampler exception aborts that request only; its blocks are freed and the
    other requests, and every later step, go on."""
    from kvscope.engine.model import sampler as sampler_module

    llm = LLM(model=default_model, device="cpu", dtype="float32", num_kv_blocks=64)
    engine = llm.engine
    real = sampler_module._results

    def poisoned(logits, tokens, rows):
        if any(r.params.seed == 666 for r in rows):
            raise RuntimeError("boom")
        return real(logits, tokens, rows)

    monkeypatch.setattr(sampler_module, "_results", poisoned)
    engine.add_request("bad", "Tell me a story", SamplingParams(max_tokens=8, seed=666))
    good_params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    engine.add_request("good", "Tell me a story", good_params)
    finals = {}
    for _ in range(50):
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        if not engine.has_unfinished_requests():
            break
    bad, good = finals["bad"].outputs[0], finals["good"].outputs[0]
    assert bad.finish_reason == "abort" and bad.error == "RuntimeError: boom"
    assert good.finish_reason == "length" and len(good.token_ids) == 8 and good.error is None
    assert llm.stats()["kv_blocks_used"] == 0
    assert llm.generate(["Hi"], SamplingParams(max_tokens=3))[0].outputs[0].token_ids


def test_a_vanishing_top_p_keeps_the_top_token(default_model):
    llm = LLM(model=default_model, device="cpu", dtype="float32", num_kv_blocks=64)
    greedy = llm.generate(["The sky is"], SamplingParams(max_tokens=4, temperature=0))
    tiny = llm.generate(["The sky is"], SamplingParams(max_tokens=4, top_p=1e-300, seed=1))
    assert tiny[0].outputs[0].token_ids == greedy[0].outputs[0].token_ids
