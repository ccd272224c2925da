"""The sampler applies a grammar's masks last (engine/structured/batch_masks.py): it must pick
the tokens that masking first, as vLLM does, picks."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from kvscope.engine.model.sampler import Sampler, SamplingRow, sample_each
from kvscope.engine.sampling_params import SamplingParams
from kvscope.engine.structured.step_masks import TokenMask, token_masks

VOCAB = 200


def bitmask(allowed: np.ndarray) -> TokenMask:
    """The mask of int32 words, bit i of word w = token 32w+i, as llguidance fills them."""
    padded = np.zeros(-(-len(allowed) // 32) * 32, dtype=bool)
    padded[: len(allowed)] = allowed
    words = torch.from_numpy(np.packbits(padded, bitorder="little").view(np.int32).copy())
    return token_masks(words[None], len(allowed))[0]


PARAMS = [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0.7, seed=3, top_k=20, top_p=0.9),
    SamplingParams(temperature=1.0, seed=4),  # free
    SamplingParams(temperature=0.9, seed=5, logit_bias={1: 3.0, 2: -2.0}, repetition_penalty=1.3),
    SamplingParams(temperature=0.8, frequency_penalty=0.4, presence_penalty=0.2, min_p=0.05),
    SamplingParams(temperature=0, allowed_token_ids=list(range(0, VOCAB, 3))),
]
CONSTRAINED = (0, 1, 3, 4, 5)
# The sampler takes another path where every row samples: the same rows, none greedy.
ALL_SAMPLED = [
    p if not p.greedy else dataclasses.replace(p, temperature=0.5, seed=10 + i)
    for i, p in enumerate(PARAMS)
]


def rows_for(
    params_list: list[SamplingParams], allowed: dict[int, np.ndarray], masked_in_rows: bool
) -> list[SamplingRow]:
    rows = []
    for i, params in enumerate(params_list):
        generator = torch.Generator().manual_seed(params.seed) if params.seed else None
        mask = bitmask(allowed[i]) if masked_in_rows and i in allowed else None
        history = list(range(i, 40 + i))
        rows.append(SamplingRow(params, history, generator, 20, banned={5} if i == 3 else ()))
        rows[-1].grammar_mask = mask
    return rows


@pytest.mark.parametrize("params_list", [PARAMS, ALL_SAMPLED], ids=["some-greedy", "all-sampled"])
@pytest.mark.parametrize("trial", range(8))
def test_masking_last_samples_what_masking_first_samples(
    trial: int, params_list: list[SamplingParams]
) -> None:
    rng = np.random.default_rng(trial)
    logits = torch.from_numpy(rng.standard_normal((len(PARAMS), VOCAB)).astype(np.float32) * 3)
    allowed = {i: rng.random(VOCAB) < rng.choice([0.02, 0.3, 0.9]) for i in CONSTRAINED}
    for i in CONSTRAINED:  # tokens every other mask keeps too: no row is left nothing
        allowed[i][[0, 3, 6]] = True
    first = logits.clone()
    for i, keep in allowed.items():
        first[i, torch.from_numpy(~keep)] = -math.inf
    raw = logits.clone()
    got = Sampler(torch.Generator().manual_seed(trial))(
        logits, rows_for(params_list, allowed, True)
    )
    want = Sampler(torch.Generator().manual_seed(trial))(
        first, rows_for(params_list, allowed, False)
    )
    assert [r.token_id for r in got] == [r.token_id for r in want]
    for i, keep in allowed.items():
        assert keep[got[i].token_id]
    assert torch.equal(logits, raw)  # the raw logits stay raw: logprobs come from them


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_min_tokens_ban_gives_way_to_a_grammar_that_allows_only_eos(temperature: float) -> None:
    eos = 7
    only_eos = np.zeros(VOCAB, dtype=bool)
    only_eos[eos] = True
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(1))
    rows = [
        SamplingRow(SamplingParams(temperature=temperature, seed=1), [], None, banned={eos}),
        SamplingRow(SamplingParams(temperature=temperature, seed=2), [], None, banned={eos}),
    ]
    rows[0].grammar_mask = bitmask(only_eos)
    out = Sampler(torch.Generator().manual_seed(0))(logits, rows)
    assert out[0].token_id == eos
    assert out[1].token_id != eos  # a free row keeps its ban


def test_a_grammar_that_allows_nothing_fails_its_request_alone() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(2))
    rows = [SamplingRow(SamplingParams(temperature=0), [], None) for _ in range(3)]
    rows[1].grammar_mask = bitmask(np.zeros(VOCAB, dtype=bool))
    rows[2].grammar_mask = bitmask(np.arange(VOCAB) == 9)
    out = sample_each(Sampler(torch.Generator().manual_seed(0)), logits, rows)
    assert isinstance(out[1], ValueError) and "allows no next token" in str(out[1])
    assert out[0].token_id == int(logits[0].argmax())
    assert out[2].token_id == 9


def test_a_mask_of_another_width_is_cut_or_padded_to_the_logits() -> None:
    """Columns past a mask are never allowed; mask columns past the logits are dropped."""
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(3))
    rows = [SamplingRow(SamplingParams(temperature=0), [], None) for _ in range(2)]
    narrow = np.zeros(VOCAB - 8, dtype=bool)
    narrow[5] = True
    wide = np.zeros(VOCAB + 8, dtype=bool)
    wide[[11, VOCAB + 2]] = True
    rows[0].grammar_mask, rows[1].grammar_mask = bitmask(narrow), bitmask(wide)
    out = Sampler(torch.Generator().manual_seed(0))(logits, rows)
    assert [r.token_id for r in out] == [5, 11]
    rows[1].grammar_mask = bitmask(np.arange(VOCAB + 8) >= VOCAB)  # only columns past the logits
    failed = sample_each(Sampler(torch.Generator().manual_seed(0)), logits, rows)
    assert isinstance(failed[1], ValueError)
