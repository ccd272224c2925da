"""Beam search over the paged cache: beams fork from their parent's blocks and free the losers.

The selection rule follows HF transformers' `_beam_search` with `early_stopping=True`: each step
keeps the top 2 x width continuations across all beams; an EOS among the top `width` becomes a
finished hypothesis scored cum_logprob / generated_len ** length_penalty; the best `width`
unfinished ones run on; the search ends once `width` hypotheses are finished or at max_tokens.
A new beam shares every block of its parent; only the partly filled last block is copied, and only
when two beams of one parent both write into it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

from kvscope.engine.kv.allocator import NoFreeBlocksError
from kvscope.engine.outputs import BeamSearchOutput, BeamSequence, RequestMetrics
from kvscope.engine.sampling_params import BeamSearchParams, SamplingParams
from kvscope.engine.sequence import Request, Sequence

if TYPE_CHECKING:
    from kvscope.engine.llm_engine import LLMEngine

_search_ids = itertools.count()


@dataclass
class _Beam:
    seq: Sequence
    cum_logprob: float


@dataclass
class _Search:
    prompt_len: int
    beams: list[_Beam]
    finished: list[tuple[float, float, list[int]]]  # (score, cum_logprob, generated ids)
    done: bool = False


class BeamSearchRunner:
    """Runs searches through the engine's own admission and stepping; beams are sequences of
    the engine's scheduler, so its counters and its event stream see them like any other."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.scheduler = engine.scheduler

    def run(self, prompts: list[list[int]], params: BeamSearchParams) -> list[BeamSearchOutput]:
        if self.engine.config.allocator != "paged":
            raise ValueError(
                f"beam search forks beams over shared blocks; allocator "
                f"{self.engine.config.allocator!r} cannot share them, use allocator='paged'"
            )
        if self.engine.has_unfinished_requests():
            raise ValueError("beam search needs an idle engine: finish or abort running requests")
        searches = [_Search(len(ids), [_Beam(self._new_seq(ids), 0.0)], []) for ids in prompts]
        try:
            for search in searches:
                seq = search.beams[0].seq
                if not self.engine.admit(seq):
                    raise self._out_of_blocks(seq.num_tokens)
            while not all(s.done for s in searches):
                self._step([s for s in searches if not s.done], params)
        finally:
            for search in searches:
                for beam in search.beams:
                    self._drop(beam)
        return [self._output(s, params) for s in searches]

    def _step(self, searches: list[_Search], params: BeamSearchParams) -> None:
        seqs = [beam.seq for search in searches for beam in search.beams]
        try:
            logits = self.engine.step_sequences(seqs)
        except NoFreeBlocksError:
            raise self._out_of_blocks(max(s.num_tokens for s in seqs)) from None
        logprobs = torch.log_softmax(logits, dim=-1)
        row = 0
        for search in searches:
            width = len(search.beams)
            self._select(search, logprobs[row : row + width], params)
            row += width
        self.engine.emit_progress([b.seq for s in searches for b in s.beams])

    def _select(self, search: _Search, logprobs: torch.Tensor, params: BeamSearchParams) -> None:
        k = params.beam_width
        eos = set() if params.ignore_eos else self.engine.eos_token_ids
        vocab = logprobs.shape[-1]
        cum = torch.tensor([b.cum_logprob for b in search.beams], device=logprobs.device)
        scores = logprobs + cum.view(-1, 1)
        # HF keeps (1 + number of EOS ids) x width candidates, at least 2 x width.
        keep = min(max(2, 1 + len(eos)) * k, scores.numel())
        top_scores, top_index = torch.topk(scores.view(-1), keep)
        generated_len = search.beams[0].seq.num_tokens - search.prompt_len + 1
        at_max = generated_len >= params.max_tokens
        survivors: list[tuple[int, int, float]] = []
        for rank, (score, index) in enumerate(
            zip(top_scores.tolist(), top_index.tolist(), strict=True)
        ):
            parent, token = divmod(index, vocab)
            if token in eos or at_max:
                # Only the top `width` may finish; the best `width` finished are kept below.
                if rank < k:
                    ids = search.beams[parent].seq.token_ids[search.prompt_len :] + [token]
                    norm = score / generated_len**params.length_penalty
                    search.finished.append((norm, score, ids))
            elif len(survivors) < k:
                survivors.append((parent, token, score))
        search.finished.sort(key=lambda f: f[0], reverse=True)
        del search.finished[k:]
        old = search.beams
        if len(search.finished) >= k or at_max or not survivors:
            search.done = True
            search.beams = []
        else:
            search.beams = [self._fork(old[p].seq, t, s) for p, t, s in survivors]
        for beam in old:
            self._drop(beam)

    def _drop(self, beam: _Beam) -> None:
        beam.seq.finish_reason = "beam"
        self.scheduler.finish(beam.seq)

    def _fork(self, parent: Sequence, token: int, cum_logprob: float) -> _Beam:
        child = self._new_seq(parent.token_ids + [token], parent.request)
        self.scheduler.fork(parent, child)
        return _Beam(child, cum_logprob)

    def _new_seq(self, token_ids: list[int], request: Request | None = None) -> Sequence:
        if request is None:
            request_id = f"beam-{next(_search_ids)}/beam"
            request = Request(
                request_id, None, list(token_ids), SamplingParams(), RequestMetrics(0)
            )
        seq = Sequence(
            request=request, index=0, token_ids=token_ids, detokenizer=None, generator=None
        )
        self.scheduler.announce(seq)
        return seq

    def _out_of_blocks(self, num_tokens: int) -> ValueError:
        bm = self.engine.allocator
        return ValueError(
            f"beam search ran out of KV blocks at {num_tokens} tokens per beam: the pool has "
            f"{bm.num_blocks} blocks of {bm.block_size}; use a smaller beam_width "
            "or max_tokens, or a larger pool"
        )

    def _output(self, search: _Search, params: BeamSearchParams) -> BeamSearchOutput:
        decode = self.engine.tokenizer.decode
        return BeamSearchOutput(
            [
                # one flat list of ids decodes to one str; the stubs say either
                BeamSequence(ids, cum, cast(str, decode(ids, skip_special_tokens=True)))
                for _, cum, ids in search.finished[: params.beam_width]
            ]
        )
