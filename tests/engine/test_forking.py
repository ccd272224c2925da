"""Copy-on-write forking: n samples share the prompt's blocks; beam search forks and frees beams."""

import pytest
import torch

from kvscope.engine import LLM, BeamSearchParams, SamplingParams


@pytest.fixture(scope="module")
def llm(default_model):
    return LLM(model=default_model, device="cpu", dtype="float32", num_kv_blocks=256)


def _chat(llm, text):
    return llm.engine.apply_chat_template([{"role": "user", "content": text}])


def _assert_clean(llm):
    bm = llm.engine.allocator
    bm.check_invariants()
    assert bm.num_used_blocks == 0


def _prompt_of_length(llm, remainder):
    """A token prompt whose length leaves `remainder` tokens in its last block."""
    base = llm.engine.tokenize(_chat(llm, "Tell me a story about a lighthouse keeper."))[1]
    bs = llm.engine.allocator.block_size
    return (base * 4)[: 3 * bs + remainder]


@pytest.mark.parametrize("remainder,expected_copies", [(5, 3), (0, 0)])
def test_n_samples_share_the_prompt_and_copy_only_the_partial_block(
    llm, remainder, expected_copies
):
    prompt = _prompt_of_length(llm, remainder)
    engine = llm.engine
    copies_before = engine.allocator.num_cow_copies
    engine.add_request("fork", prompt, SamplingParams(n=4, max_tokens=3, seed=5, ignore_eos=True))
    engine.step()  # prefill once, fork three children, sample four first tokens
    bm = engine.allocator
    tables = [bm.table(s.seq_id) for s in engine.requests["fork"].sequences]
    full = len(prompt) // bm.block_size
    assert all(t[:full] == tables[0][:full] for t in tables)  # full blocks shared, never copied
    assert all(bm.blocks[b].ref_count == 4 for b in tables[0][:full])
    while engine.has_unfinished_requests():
        engine.step()
    assert bm.num_cow_copies - copies_before == expected_copies
    _assert_clean(llm)


def test_n_samples_use_fewer_blocks_than_independent_requests(llm, default_model):
    prompt = _prompt_of_length(llm, 9)
    params = SamplingParams(max_tokens=4, seed=1, ignore_eos=True)

    def peak_blocks(requests):
        engine, peak = llm.engine, 0
        for i, p in enumerate(requests):
            engine.add_request(f"peak-{i}", prompt, p)
        while engine.has_unfinished_requests():
            engine.step()
            peak = max(peak, engine.allocator.num_used_blocks)
        return peak

    forked = peak_blocks([SamplingParams(n=4, max_tokens=4, seed=1, ignore_eos=True)])
    no_cache = LLM(
        model=default_model, device="cpu", num_kv_blocks=256, enable_prefix_caching=False
    )
    engine, peak = no_cache.engine, 0
    for i in range(4):
        engine.add_request(f"ind-{i}", prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, engine.allocator.num_used_blocks)
    assert forked <= peak / 2
    _assert_clean(llm)


def test_seeded_n_samples_are_reproducible(llm):
    params = SamplingParams(n=3, max_tokens=6, seed=11, ignore_eos=True)
    prompt = _chat(llm, "Name a color.")
    first = [o.token_ids for o in llm.generate(prompt, params)[0].outputs]
    again = [o.token_ids for o in llm.generate(prompt, params)[0].outputs]
    assert first == again and len({tuple(t) for t in first}) > 1
    _assert_clean(llm)


@pytest.mark.slow
def test_beam_search_matches_hf(llm, hf_default, chat_prompts):
    width, max_tokens = 4, 16
    for text in chat_prompts[:3]:
        ids = llm.engine.tokenize(_chat(llm, text))[1]
        ours = llm.beam_search([ids], BeamSearchParams(beam_width=width, max_tokens=max_tokens))
        with torch.no_grad():
            ref = hf_default.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                num_beams=width,
                num_return_sequences=width,
                max_new_tokens=max_tokens,
                do_sample=False,
                early_stopping=True,
                length_penalty=1.0,
            )
        seqs = ours[0].sequences
        assert len(seqs) == width
        for got, want in zip(seqs, ref, strict=True):
            want = want[len(ids) :].tolist()
            # HF pads finished beams to the longest with the pad token (here also EOS).
            assert want[: len(got.token_ids)] == got.token_ids
            assert all(
                t == hf_default.generation_config.pad_token_id for t in want[len(got.token_ids) :]
            )
        scores = [s.cum_logprob / len(s.token_ids) for s in seqs]
        assert scores == sorted(scores, reverse=True)
        assert seqs[0].text == llm.get_tokenizer().decode(
            seqs[0].token_ids, skip_special_tokens=True
        )
    _assert_clean(llm)


def test_beam_search_errors_leave_the_engine_usable(default_model):
    small = LLM(model=default_model, device="cpu", num_kv_blocks=6)
    prompt = list(range(100, 140))
    with pytest.raises(ValueError, match="ran out of KV blocks"):
        small.beam_search([prompt], BeamSearchParams(beam_width=8, max_tokens=40))
    _assert_clean(small)
    small.engine.add_request("busy", prompt, SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="idle engine"):
        small.beam_search([prompt], BeamSearchParams(beam_width=2, max_tokens=2))
    while small.engine.has_unfinished_requests():
        small.engine.step()
    result = small.beam_search(
        [prompt], BeamSearchParams(beam_width=2, max_tokens=4, ignore_eos=True)
    )
    assert [len(s.token_ids) for s in result[0].sequences] == [4, 4]
    _assert_clean(small)


def test_aborting_a_forked_request_returns_every_block(llm):
    engine = llm.engine
    prompt = _prompt_of_length(llm, 7)
    engine.add_request("gone", prompt, SamplingParams(n=4, max_tokens=20, seed=2))
    engine.step()
    engine.step()  # forked and decoding: the shared blocks have ref count 4
    out = engine.abort_request("gone")
    assert [o.finish_reason for o in out.outputs] == ["abort"] * 4
    _assert_clean(llm)


def test_aborting_before_the_fork_returns_every_block(default_model):
    # A chunked prefill: the request is aborted while its samples still wait to fork.
    llm = LLM(model=default_model, device="cpu", num_kv_blocks=64, max_num_batched_tokens=16)
    engine = llm.engine
    engine.add_request("early", list(range(100, 160)), SamplingParams(n=3, max_tokens=4))
    engine.step()
    assert engine.allocator.num_used_blocks > 0
    engine.abort_request("early")
    assert not engine.has_unfinished_requests()
    _assert_clean(llm)
