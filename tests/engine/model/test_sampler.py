import math

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from kvscope.engine.model.sampler import (
    Sampler,
    SamplingRow,
    _apply_repetition_penalty,
    _filter_cutoff,
)
from kvscope.engine.sampling_params import SamplingParams

# A crafted distribution over 8 tokens, best first, shuffled in the vocabulary.
PROBS = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.015, 0.005])
ORDER = torch.tensor([3, 0, 6, 1, 7, 2, 5, 4])  # ORDER[r] = token id of rank r
LOGITS = torch.empty(8).index_put_((ORDER,), PROBS.log())


@pytest.fixture
def sampler():
    return Sampler(torch.Generator().manual_seed(0))


def rows_of(params, count, generator=None):
    return [SamplingRow(params, [], generator) for _ in range(count)]


def draw(sampler, params, count=4000, logits=LOGITS):
    out = sampler(logits.expand(count, -1), rows_of(params, count))
    return torch.tensor([r.token_id for r in out])


def counts(tokens, vocab):
    return torch.bincount(tokens, minlength=vocab).double()


def test_greedy_rows_take_the_argmax_next_to_sampled_rows(sampler):
    logits = torch.randn(6, 1000, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=0), SamplingParams(top_k=5)] * 3
    out = sampler(logits, [SamplingRow(p, [], None) for p in params])
    for i in (0, 2, 4):
        assert out[i].token_id == int(logits[i].argmax())


def test_top_k_1_equals_greedy(sampler):
    logits = torch.randn(32, 500, generator=torch.Generator().manual_seed(2))
    out = sampler(logits, rows_of(SamplingParams(top_k=1, temperature=1.7), 32))
    assert [r.token_id for r in out] == logits.argmax(-1).tolist()


@pytest.mark.parametrize(
    ("params", "ranks_kept"),
    [
        (SamplingParams(top_k=3), 3),
        (SamplingParams(top_p=0.3), 1),
        (SamplingParams(top_p=0.6), 2),
        (SamplingParams(top_p=0.85), 4),
        (SamplingParams(min_p=0.3), 3),  # keeps p >= 0.12
        (SamplingParams(min_p=0.2, top_k=2), 2),
        (SamplingParams(top_k=4, top_p=0.75), 3),  # nucleus of the renormalized top 4
    ],
)
def test_filters_never_sample_excluded_tokens(sampler, params, ranks_kept):
    seen = set(draw(sampler, params).tolist())
    assert seen == set(ORDER[:ranks_kept].tolist())


def reference_kept(logits, params):
    """Brute force: ids that top-k, then top-p, then min-p keep in a temperature-scaled row."""
    probs = (logits / params.temperature).softmax(-1).double()
    order = probs.argsort(descending=True)
    k = params.top_k if params.top_k > 0 else len(probs)
    kept = order[:k]
    renorm = probs[kept] / probs[kept].sum()
    if params.top_p < 1:
        before = renorm.cumsum(0) - renorm
        kept = kept[before < params.top_p]
    return set(kept[probs[kept] >= params.min_p * probs.max()].tolist())


FILTER_CASES = [
    SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m)
    for t, k, p, m in [
        (0.5, -1, 0.9, 0.0),
        (2.0, -1, 0.9, 0.0),
        (20.0, -1, 0.95, 0.0),
        (1.0, 50, 1.0, 0.0),
        (3.0, 10, 0.5, 0.1),
        (1.0, -1, 1.0, 0.05),
        (1.0, 100, 0.8, 0.0),
        (5.0, 2000, 0.99, 0.0),
    ]
]


@pytest.mark.parametrize("num_cases", [6, 8])  # without / with top_k > 64, which widens rung one
def test_filter_cutoff_matches_brute_force_on_every_candidate_width(num_cases):
    # Temperatures from sharp to flat push nuclei past 64 and 1024 candidates, so rows end up
    # resolved by each rung of the topk ladder and by the full sort.
    params = FILTER_CASES[:num_cases] * 3
    logits = torch.randn(len(params), 3000, generator=torch.Generator().manual_seed(3)) * 3
    scaled = logits / torch.tensor([p.temperature for p in params]).unsqueeze(1)
    cutoff = _filter_cutoff(scaled, params)
    for row, p in enumerate(params):
        kept = set((scaled[row] >= cutoff[row]).nonzero().flatten().tolist())
        assert kept == reference_kept(logits[row], p), p


def test_no_filtering_work_when_no_row_filters():
    assert _filter_cutoff(torch.randn(3, 50), [SamplingParams()] * 3) is None


def test_temperature_sampling_matches_softmax_frequencies(sampler):
    temperature, count = 0.7, 20000
    tokens = draw(sampler, SamplingParams(temperature=temperature), count)
    expected = (LOGITS / temperature).softmax(-1).double() * count
    chi2 = float(((counts(tokens, 8) - expected) ** 2 / expected).sum())
    assert chi2 < 24.3  # 7 degrees of freedom, p = 0.001


def test_top_k_sampling_matches_renormalized_frequencies(sampler):
    count = 20000
    tokens = draw(sampler, SamplingParams(top_k=3), count)
    top3 = ORDER[:3]
    expected = PROBS[:3].double() / PROBS[:3].sum() * count
    chi2 = float(((counts(tokens, 8)[top3] - expected) ** 2 / expected).sum())
    assert chi2 < 13.8  # 2 degrees of freedom, p = 0.001


def test_repetition_penalty_matches_hf():
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 300, generator=gen) * 4
    ids = [[5, 7, 7, 299, 0], [1, 2, 3], [8, 8]]
    penalties = [1.3, 0.7, 1.0]
    rows = [
        SamplingRow(SamplingParams(repetition_penalty=r), i, None)
        for r, i in zip(penalties, ids, strict=True)
    ]
    before = logits.clone()
    ours = _apply_repetition_penalty(logits, rows)
    for row, (r, i) in enumerate(zip(penalties, ids, strict=True)):
        hf = RepetitionPenaltyLogitsProcessor(r)(torch.tensor([i]), logits[row : row + 1].clone())
        torch.testing.assert_close(ours[row], hf[0], rtol=0, atol=0)
    assert torch.equal(logits, before)  # the caller's logits are left alone


def test_repetition_penalty_steers_greedy_choice(sampler):
    logits = torch.tensor([[3.0, 2.9, -1.0]])
    row = SamplingRow(SamplingParams(temperature=0, repetition_penalty=1.2), [0, 0], None)
    assert sampler(logits, [row])[0].token_id == 1


def test_seeded_rows_reproduce_regardless_of_the_batch():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 2000, generator=gen)
    seeded = SamplingParams(seed=7, top_p=0.95)

    def run(order, default_seed):
        sampler = Sampler(torch.Generator().manual_seed(default_seed))
        mine = torch.Generator().manual_seed(7)
        picks = []
        for _ in range(5):
            # Neighbours that change the filter's candidate widths and the default stream.
            others = [SamplingParams(temperature=1.3), SamplingParams(top_k=1500), SamplingParams()]
            rows = [SamplingRow(seeded, [], mine)] + [SamplingRow(p, [], None) for p in others]
            perm = [rows[i] for i in order]
            out = sampler(logits[order], perm)
            picks.append(out[order.index(0)].token_id)
        return picks

    alone = run([0], 0)
    assert run([0, 1, 2, 3], 1) == alone
    assert run([3, 1, 0, 2], 2) == alone


def test_logprobs_are_raw_log_softmax_and_include_the_sample(sampler):
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(3, 400, generator=gen) * 2
    params = [
        SamplingParams(logprobs=5, temperature=0.5, repetition_penalty=1.5),
        SamplingParams(logprobs=0, top_k=50),
        SamplingParams(temperature=0),
    ]
    rows = [SamplingRow(p, list(range(100)), None) for p in params]
    out = sampler(logits, rows)
    raw = logits.log_softmax(-1)
    for row, r in enumerate(out):
        assert math.isclose(r.logprob, float(raw[row, r.token_id]), abs_tol=1e-5)
    top5 = raw[0].topk(5)
    assert set(top5.indices.tolist()) <= set(out[0].top_logprobs)
    assert out[0].token_id in out[0].top_logprobs
    for token, value in out[0].top_logprobs.items():
        assert math.isclose(value, float(raw[0, token]), abs_tol=1e-5)
    assert out[1].top_logprobs == {out[1].token_id: out[1].logprob}
    assert out[2].top_logprobs is None


def test_empty_batch(sampler):
    assert sampler(torch.empty(0, 10), []) == []
