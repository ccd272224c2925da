"""Batched next-token sampling: vLLM's logits processors (allowed_token_ids, min_tokens,
logit_bias), penalties (repetition, frequency, presence), greedy, temperature, top-k / top-p /
min-p, in vLLM's order.

Everything is vectorized across rows; the only per-row Python work is what the data forces:
turning each row's token ids into a tensor for the penalty, and drawing noise from each seeded
request's own generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

import torch

from kvscope.engine.sampling_params import SamplingParams
from kvscope.engine.structured.batch_masks import BatchMasks
from kvscope.engine.structured.step_masks import TokenMask

# Top-k / top-p look at the best few candidates before sorting a whole row: on a 2-core CPU a
# full sort of a 49k vocabulary costs ~2 ms a row, topk(64) a twentieth of that, and most nuclei
# are narrow. Rows whose nucleus is wider move up the ladder; only the rest pay for a sort.
_FIRST_WIDTH = 64
_SECOND_WIDTH = 1024


@dataclass
class SamplingRow:
    params: SamplingParams
    token_ids: Sequence[int]  # prompt + generated so far: the penalty sees both (HF semantics)
    generator: torch.Generator | None  # the request's own stream when it set a seed
    # token_ids[num_prompt_tokens:] were generated: frequency and presence penalties see those.
    num_prompt_tokens: int = 0
    # Token ids that may not be sampled now: EOS and stop_token_ids before min_tokens is reached.
    banned: Collection[int] = ()
    # A structured-output request's allowed next tokens (engine/structured/step_masks.py).
    grammar_mask: TokenMask | None = None


@dataclass
class SampleResult:
    token_id: int
    logprob: float  # under the raw model distribution: before penalties and temperature
    top_logprobs: dict[int, float] | None  # when params.logprobs is set; token_id always in it


class Sampler:
    def __init__(self, default_generator: torch.Generator) -> None:
        # Rows without a seed draw from this one stream; it must live on the logits' device.
        self.default_generator = default_generator

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]) -> list[SampleResult]:
        """Pick one token per row of logits [S, V]; rows[i] says how for row i."""
        if not rows:
            return []
        logits = logits.float()
        # vLLM's order: masks and biases, then penalties; logits itself stays raw for logprobs.
        # A grammar's masks come last (engine/structured/batch_masks.py says why that is the same).
        grammar = BatchMasks.of([r.grammar_mask for r in rows], logits.shape[1], logits.device)
        scores = _apply_bias(logits, rows)
        scores = _apply_repetition_penalty(scores, rows)
        scores = _apply_output_penalties(scores, logits, rows)
        if grammar is not None:
            _let_the_grammar_rule(scores, logits, rows, grammar)
        random_rows = [i for i, r in enumerate(rows) if not r.params.greedy]
        if len(random_rows) == len(rows):
            tokens = self._sample(scores, rows, grammar)
        else:
            if grammar is not None:
                if scores is logits:
                    scores = logits.clone()
                grammar.apply_(scores)
            tokens = scores.argmax(-1)  # greedy rows keep this; random rows are overwritten
            if random_rows:
                idx = torch.tensor(random_rows, device=logits.device)
                tokens[idx] = self._sample(scores[idx], [rows[i] for i in random_rows], None)
        return _results(logits, tokens, rows)

    def _sample(
        self, scores: torch.Tensor, rows: list[SamplingRow], grammar: BatchMasks | None
    ) -> torch.Tensor:
        temperature = [r.params.temperature for r in rows]
        scores = scores / torch.tensor(temperature, device=scores.device).unsqueeze(1)
        if grammar is not None:  # on the new tensor: the raw logits are never written
            grammar.apply_(scores)
        cutoff = _filter_cutoff(scores, [r.params for r in rows])
        if cutoff is not None:
            scores.masked_fill_(scores < cutoff.unsqueeze(1), -math.inf)
        probs = scores.softmax(-1)
        # Exponential race: argmax(p_i / E_i) with E_i ~ Exp(1) picks token i with probability
        # p_i, needs no cumulative sum, and ties a row's outcome to its own noise only.
        return probs.div_(self._exponential_noise(probs, rows)).argmax(-1)

    def _exponential_noise(self, like: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        noise = torch.empty_like(like)
        unseeded = [i for i, r in enumerate(rows) if r.generator is None]
        if len(unseeded) == len(rows):
            noise.uniform_(generator=self.default_generator)
        else:
            # A seeded row always draws exactly one vocabulary's worth from its own generator,
            # so its tokens do not depend on what else is in the batch.
            for i, r in enumerate(rows):
                if r.generator is not None:
                    noise[i].uniform_(generator=r.generator)
            if unseeded:
                shape = (len(unseeded), like.shape[1])
                drawn = torch.rand(shape, generator=self.default_generator, device=like.device)
                noise[torch.tensor(unseeded, device=like.device)] = drawn
        # -log(U) is Exp(1) and ~3x faster than Tensor.exponential_ on CPU. U == 0 gives inf,
        # which only makes that token lose the race (never NaN: probabilities are finite).
        return noise.log_().neg_()


def _apply_bias(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """vLLM's allowed_token_ids mask, min_tokens' mask of the stop tokens and logit_bias (added,
    as vLLM's LogitBiasLogitsProcessor does). A new tensor when any row asks."""
    todo = [i for i, r in enumerate(rows) if _biased(r)]
    if not todo:
        return logits
    scores = logits.clone()
    vocab = scores.shape[1]

    def ids_of(values: Iterable[int]) -> torch.Tensor:
        # Like the repetition penalty, ignore ids the logits have no column for.
        inside = [t for t in values if t < vocab]
        return torch.tensor(inside, dtype=torch.long, device=scores.device)

    for i in todo:
        params = rows[i].params
        if params.allowed_token_ids is not None:
            allowed = ids_of(params.allowed_token_ids)
            kept = scores[i, allowed]
            scores[i].fill_(-math.inf)
            scores[i, allowed] = kept
        if rows[i].banned:
            scores[i, ids_of(rows[i].banned)] = -math.inf
        if params.logit_bias:
            inside = {t: b for t, b in params.logit_bias.items() if t < vocab}
            bias = torch.tensor(list(inside.values()), device=scores.device)
            scores[i, ids_of(inside)] += bias  # dict keys are distinct: no id is added twice
    return scores


def _biased(row: SamplingRow) -> bool:
    return bool(row.banned or row.params.logit_bias or row.params.allowed_token_ids is not None)


def _let_the_grammar_rule(
    scores: torch.Tensor, logits: torch.Tensor, rows: list[SamplingRow], grammar: BatchMasks
) -> None:
    """The grammar is the hard rule: where the other masks (min_tokens banning EOS when the
    grammar allows only EOS) leave a constrained row nothing, they give way, and that row keeps
    its penalties alone. `scores` is a new tensor wherever a row was masked."""
    for j, i in enumerate(grammar.rows):
        if not _biased(rows[i]) or grammar.allowed_any(j, scores[i]):
            continue
        raw = logits[i : i + 1]
        unmasked = _apply_output_penalties(
            _apply_repetition_penalty(raw, [rows[i]]), raw, [rows[i]]
        )
        scores[i] = unmasked[0]


def _apply_output_penalties(
    scores: torch.Tensor, logits: torch.Tensor, rows: list[SamplingRow]
) -> torch.Tensor:
    """OpenAI's (and vLLM's) frequency and presence penalties over the generated tokens only:
    logit -= frequency_penalty * count + presence_penalty * (count > 0)."""
    todo = [
        i
        for i, r in enumerate(rows)
        if (r.params.frequency_penalty or r.params.presence_penalty)
        and len(r.token_ids) > r.num_prompt_tokens
    ]
    if not todo:
        return scores
    if scores is logits:  # never write into the raw logits: logprobs are computed from them
        scores = logits.clone()
    vocab = scores.shape[1]
    for i in todo:
        row = rows[i]
        out = torch.as_tensor(row.token_ids[row.num_prompt_tokens :], dtype=torch.long)
        ids, count = torch.unique(out[out < vocab], return_counts=True)
        penalty = row.params.frequency_penalty * count + row.params.presence_penalty
        ids = ids.to(scores.device)
        scores[i, ids] -= penalty.to(scores.device, scores.dtype)
    return scores


def _apply_repetition_penalty(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """HF's RepetitionPenaltyLogitsProcessor: every token seen in the row's ids gets a logit
    divided by the penalty when positive, multiplied when negative. Returns a new tensor."""
    penalized = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
    if not penalized:
        return logits
    ids = [torch.as_tensor(rows[i].token_ids, dtype=torch.long) for i in penalized]
    lengths = torch.tensor([len(t) for t in ids])
    penalty = [rows[i].params.repetition_penalty for i in penalized]
    row = torch.tensor(penalized).repeat_interleave(lengths)
    col = torch.cat(ids)
    factor = torch.tensor(penalty).repeat_interleave(lengths)
    # Like HF, ignore ids the logits have no column for (embedding tables can outgrow lm_head).
    inside = col < logits.shape[1]
    row, col, factor = (t[inside].to(logits.device) for t in (row, col, factor))
    # Touch only the seen (row, id) pairs: a repeated id is written twice with the same value.
    old = logits[row, col]
    return logits.index_put((row, col), torch.where(old < 0, old * factor, old / factor))


def _filter_cutoff(scores: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor | None:
    """Per-row logit below which top-k, top-p and min-p drop tokens; None when no row filters."""
    vocab = scores.shape[1]
    top_k = [min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params]
    nucleus = [i for i, p in enumerate(params) if top_k[i] < vocab or p.top_p < 1]
    with_min_p = [i for i, p in enumerate(params) if p.min_p > 0]
    if not nucleus and not with_min_p:
        return None
    cutoff = scores.new_full((len(params),), -math.inf)
    if nucleus:
        idx = torch.tensor(nucleus, device=scores.device)
        cutoff[idx] = _top_k_top_p_cutoff(
            scores[idx], [top_k[i] for i in nucleus], [params[i].top_p for i in nucleus]
        )
    if with_min_p:
        # min-p compares with the top token's probability. Top-k / top-p always keep that token
        # and renormalizing keeps ratios, so the threshold is the same before or after them.
        idx = torch.tensor(with_min_p, device=scores.device)
        log_min_p = torch.tensor([params[i].min_p for i in with_min_p], device=scores.device).log()
        cutoff[idx] = torch.maximum(cutoff[idx], scores.amax(-1)[idx] + log_min_p)
    return cutoff


def _top_k_top_p_cutoff(scores: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Per-row logit of the last token that top-k, then top-p over the top-k distribution, keep
    (top-p keeps the smallest prefix whose mass reaches top_p). Ties with it survive too."""
    rows, vocab = scores.shape
    device = scores.device
    k_all = torch.tensor(top_k, device=device)
    # top_p == 1 keeps everything; comparing with inf stops float rounding from cutting the tail.
    p_all = torch.tensor([p if p < 1 else math.inf for p in top_p], device=device)
    # Only rows with top-k off need the whole row's normalizer.
    full_lse = scores.logsumexp(-1) if vocab in top_k else None
    cutoff = scores.new_empty(rows)
    pending = torch.arange(rows, device=device)
    widest_k = max((k for k in top_k if k < vocab), default=0)
    widths = sorted({w for w in (max(_FIRST_WIDTH, widest_k), _SECOND_WIDTH) if w < vocab})
    for width in [*widths, vocab]:
        sub = scores if len(pending) == rows else scores[pending]
        k, p = k_all[pending], p_all[pending]
        if width < vocab:
            vals = sub.topk(width, -1).values
        else:
            vals = sub.sort(-1, descending=True).values
        in_k = torch.arange(width, device=device) < k.unsqueeze(1)
        vals_k = vals.masked_fill(~in_k, -math.inf)
        # The top-k distribution's normalizer is known once all k tokens are in view, or when
        # top-k is off (k == vocab) and it is the whole row's.
        k_in_view = k <= width
        norm = vals_k.logsumexp(-1)
        if full_lse is not None:
            norm = torch.where(k_in_view, norm, full_lse[pending])
        probs = (vals_k - norm.unsqueeze(1)).exp()
        mass_before = probs.cumsum(-1) - probs
        # At least the top token: a top_p that underflows float32 (1e-300) would keep none.
        keep = ((mass_before < p.unsqueeze(1)) & in_k).sum(-1).clamp_(min=1)
        # Keeping fewer than `width` means the nucleus closed inside the candidates we saw.
        done = k_in_view | ((k == vocab) & (keep < width))
        last = (keep[done] - 1).unsqueeze(1)
        cutoff[pending[done]] = vals[done].gather(1, last).squeeze(1)
        pending = pending[~done]
        if pending.numel() == 0:
            break
    return cutoff


def _results(
    logits: torch.Tensor, tokens: torch.Tensor, rows: list[SamplingRow]
) -> list[SampleResult]:
    # Logprobs describe the raw model distribution (vLLM's default), not the sampling one.
    lse = logits.logsumexp(-1)
    logprob = (logits.gather(1, tokens.unsqueeze(1)).squeeze(1) - lse).tolist()
    token_ids = tokens.tolist()
    want = {i: n for i, r in enumerate(rows) if (n := r.params.logprobs)}
    tops: dict[int, dict[int, float]] = {}
    if want:
        idx = torch.tensor(list(want), device=logits.device)
        vals, ids = logits[idx].topk(max(want.values()), -1)
        vals = vals - lse[idx].unsqueeze(1)
        for (i, n), ids_i, vals_i in zip(want.items(), ids.tolist(), vals.tolist(), strict=True):
            tops[i] = dict(zip(ids_i[:n], vals_i[:n], strict=True))
    results = []
    for i, r in enumerate(rows):
        top_logprobs = None
        if r.params.logprobs is not None:
            top_logprobs = tops.get(i, {})
            top_logprobs[token_ids[i]] = logprob[i]
        results.append(SampleResult(token_ids[i], logprob[i], top_logprobs))
    return results


def sample_each(
    sampler: Callable[[torch.Tensor, list[SamplingRow]], list[SampleResult]],
    logits: torch.Tensor,
    rows: list[SamplingRow],
) -> list[SampleResult | Exception]:
    """Sample every row; if the batch fails, row by row, so that one request's failure
    (an exception for its parameters) fails that request alone and the others go on."""
    try:
        return list(sampler(logits, rows))
    except Exception:
        results: list[SampleResult | Exception] = []
        for i, row in enumerate(rows):
            try:
                results.extend(sampler(logits[i : i + 1], [row]))
            except Exception as e:  # this row's own failure: reported on its output
                results.append(e)
        return results
