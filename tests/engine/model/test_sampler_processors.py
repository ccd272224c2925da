"""The sampler's vLLM logits processors and penalties: allowed_token_ids, min_tokens' mask,
logit_bias, frequency and presence penalties, against brute-force references written from vLLM's
formulas (its sampler needs its compiled ops, so it cannot run here), and in vLLM's order."""

import math

import pytest
import torch

from kvscope.engine.model.sampler import (
    Sampler,
    SamplingRow,
    _apply_bias,
    _apply_output_penalties,
)
from kvscope.engine.sampling_params import SamplingParams

VOCAB = 50


@pytest.fixture
def sampler():
    return Sampler(torch.Generator().manual_seed(0))


def random_logits(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed))


def test_masks_and_bias_match_a_brute_force_reference():
    logits = random_logits(4, 1)
    rows = [
        SamplingRow(SamplingParams(allowed_token_ids=[3, 7, 9]), [], None),
        SamplingRow(SamplingParams(logit_bias={2: 5.0, 11: -1.5}), [], None, banned={2, 4}),
        SamplingRow(SamplingParams(), [], None),
        SamplingRow(SamplingParams(allowed_token_ids=[1, 2], logit_bias={1: 0.25}), [], None),
    ]
    got = _apply_bias(logits, rows)
    want = logits.clone()
    for i, row in enumerate(rows):
        allowed = row.params.allowed_token_ids
        for t in range(VOCAB):
            if (allowed is not None and t not in allowed) or t in row.banned:
                want[i, t] = -math.inf
            else:
                want[i, t] += (row.params.logit_bias or {}).get(t, 0.0)
    assert torch.equal(got, want)
    assert got is not logits and not torch.isinf(logits).any()  # the raw logits stay raw


def test_output_penalties_count_generated_tokens_only():
    logits = random_logits(2, 2)
    prompt = [5, 5, 6]
    generated = [6, 8, 8, 8, 9]
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=-0.75)
    rows = [
        SamplingRow(params, prompt + generated, None, num_prompt_tokens=len(prompt)),
        SamplingRow(params, prompt, None, num_prompt_tokens=len(prompt)),  # nothing yet
    ]
    got = _apply_output_penalties(logits, logits, rows)
    want = logits.clone()
    for t in set(generated):  # logit -= frequency * count + presence * (count > 0)
        want[0, t] -= 0.5 * generated.count(t) - 0.75
    assert torch.allclose(got, want) and torch.equal(got[1], logits[1])
    assert got is not logits  # a fresh tensor: logprobs are computed from the raw one


def test_greedy_takes_the_best_allowed_and_never_a_banned_token(sampler):
    logits = random_logits(3, 3)
    best = logits.argmax(-1).tolist()
    allowed = [t for t in range(VOCAB) if t != best[0]][:10]
    rows = [
        SamplingRow(SamplingParams(temperature=0, allowed_token_ids=allowed), [], None),
        SamplingRow(SamplingParams(temperature=0), [], None, banned={best[1]}),
        SamplingRow(SamplingParams(temperature=0, logit_bias={7: 100.0}), [], None),
    ]
    out = [r.token_id for r in sampler(logits, rows)]
    assert out[0] == max(allowed, key=lambda t: logits[0, t])
    assert out[1] == int(logits[1].masked_fill(torch.arange(VOCAB) == best[1], -math.inf).argmax())
    assert out[2] == 7


def test_random_rows_draw_only_allowed_unbanned_tokens(sampler):
    logits = random_logits(1, 4).expand(2000, -1)
    params = SamplingParams(temperature=1.5, allowed_token_ids=[1, 2, 3, 4])
    rows = [SamplingRow(params, [], None, banned={2}) for _ in range(2000)]
    assert {r.token_id for r in sampler(logits, rows)} == {1, 3, 4}


def test_logprobs_stay_raw_under_bias_and_penalties(sampler):
    logits = random_logits(1, 5)
    params = SamplingParams(
        temperature=0, logprobs=2, logit_bias={0: 50.0}, frequency_penalty=2.0, min_tokens=1
    )
    row = SamplingRow(params, [9, 0, 0], None, num_prompt_tokens=1, banned={3})
    result = sampler(logits, [row])[0]
    raw = logits[0].log_softmax(-1)
    assert result.token_id == 0  # the bias outweighs the penalty (+50 - 2 * 2)
    assert result.logprob == pytest.approx(float(raw[0]))
    assert set(result.top_logprobs) >= set(raw.topk(2).indices.tolist())


def test_bias_comes_before_the_repetition_penalty_as_in_vllm(sampler):
    """vLLM applies logit_bias (a logits processor) before its penalties. Token 0 (logit 1, in
    the prompt) with bias -3 then penalty 2 scores (1 - 3) * 2 = -4 and loses to token 1 at -3;
    penalty first would give 1 / 2 - 3 = -2.5 and pick token 0."""
    logits = torch.full((1, 4), -10.0)
    logits[0, 0], logits[0, 1] = 1.0, -3.0
    params = SamplingParams(temperature=0, logit_bias={0: -3.0}, repetition_penalty=2.0)
    assert sampler(logits, [SamplingRow(params, [0], None)])[0].token_id == 1
