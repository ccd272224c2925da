"""LLMEngine: add_request / step / abort over the scheduler, the model runner and the sampler.

What it shows of itself (stats, a block's contents) is in `engine.inspection`; the event log and
its observers (snapshots, the contiguous shadow, recording) in `engine.kv.observers`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from kvscope.engine import inspection, prompts
from kvscope.engine.config import EngineConfig
from kvscope.engine.cpu_threads import apply_num_threads
from kvscope.engine.detokenizer import IncrementalDetokenizer
from kvscope.engine.kv.events import KVEvent, StepProgress
from kvscope.engine.kv.kv_cache import KVCache
from kvscope.engine.kv.snapshot import KVSnapshot
from kvscope.engine.model.kv_calibration import calibrate_kv_scales, calibration_token_ids
from kvscope.engine.model.loader import LoadedModel, load_model
from kvscope.engine.model.sampler import Sampler, SampleResult, SamplingRow, sample_each
from kvscope.engine.model_runner import ModelRunner, StepRunner
from kvscope.engine.outputs import RequestMetrics, RequestOutput
from kvscope.engine.pool_parts import build_pool
from kvscope.engine.prompts import PromptInput
from kvscope.engine.sampling_params import SamplingParams
from kvscope.engine.scheduler import ScheduledBatch
from kvscope.engine.sequence import Request, Sequence
from kvscope.engine.sizing.float32_weights import float32_choice
from kvscope.engine.sizing.kv_pool import kv_layout, size_kv_pool
from kvscope.engine.sizing.model_build import build_model, free_memory, kv_pool_bytes
from kvscope.engine.sizing.weight_plan import weights_quantized
from kvscope.engine.structured.compiler import CompiledGrammar, GrammarCompiler
from kvscope.engine.structured.step_masks import StepMasks, TokenMask
from kvscope.engine.trace import PoolCounts, StepShape, TraceLog, TraceSettings


class LLMEngine:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.config = config
        # Before the weights load: dequantizing and repacking them runs on these threads too.
        self.num_threads = apply_num_threads(config.num_threads)
        loaded = loaded or load_model(config.model)
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.model_source = loaded.source
        mc = loaded.config
        if config.max_model_len is not None and config.max_model_len > mc.max_position_embeddings:
            raise ValueError(
                f"max_model_len {config.max_model_len} exceeds the model's context length "
                f"{mc.max_position_embeddings}"
            )
        self.max_model_len = config.max_model_len or mc.max_position_embeddings
        config.weights_quantized = weights_quantized(loaded.weights.kinds(), config.quantization)
        device = config.torch_device
        # float32 over a quantized file: dequantized once at load when that fits, not per call.
        self.weight_choice = float32_choice(
            config,
            loaded.weights.shapes(),
            loaded.weights.kinds(),
            loaded.config.tie_word_embeddings,
            kv_pool_bytes(config, loaded),
            free_memory(device),
        )
        build_config = replace(config, quantization=self.weight_choice.quantization)
        self.model = build_model(build_config, loaded, self.max_model_len)
        num_blocks = size_kv_pool(config, mc, self.model)
        # KV groups: sliding-window layers apart from full ones, so their blocks can go back.
        self.kv_layout = kv_layout(config, mc)
        self.kv_cache = KVCache(
            mc.num_layers,
            num_blocks,
            config.block_size,
            mc.num_kv_heads,
            mc.head_dim,
            config.kv_torch_dtype,
            device,
            self.kv_layout,
        )
        if self.kv_cache.is_fp8:
            ids = calibration_token_ids(self.tokenizer)
            calibrate_kv_scales(self.model, self.kv_cache, ids)
        salt = f"{loaded.source}|{config.kv_torch_dtype}".encode()
        pool = build_pool(config, self.kv_layout, num_blocks, self.max_model_len, salt)
        self.max_seq_len, self.observers = pool.max_seq_len, pool.observers
        self.allocator, self.scheduler = pool.allocator, pool.scheduler
        self.runner: StepRunner = ModelRunner(self.model, self.kv_cache)
        self.generator = torch.Generator(device=device).manual_seed(config.seed)
        self.sampler = Sampler(self.generator)
        self.requests: dict[str, Request] = {}
        self.eos_token_ids = set(mc.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)
        self.num_steps = 0
        # Structured outputs: the grammars (compiled once per constraint, from any thread) and
        # the masks of each step, filled while the model runs.
        grammars = GrammarCompiler(self.tokenizer, mc.vocab_size, self.eos_token_ids)
        # Through `grammars`, not self: the engine must not sit in a reference cycle (it is
        # freed by reference counting alone, tests/engine/test_engine_teardown.py).
        self.grammars, self.step_masks = (
            grammars,
            StepMasks(lambda: grammars.mask_vocab_size, mc.vocab_size),
        )
        # Always on and bounded: what a what-if replay of this session needs (engine.whatif).
        self.trace = TraceLog(TraceSettings.of_engine(self))
        # Fixed once built; computed here so stats() stays cheap at the app's 10 Hz.
        self.weight_bytes = self.model.weight_bytes()
        self.weight_format = self.model.weight_format()

    # ---- requests ------------------------------------------------------------------------
    def tokenize(self, prompt: PromptInput) -> tuple[str | None, list[int]]:
        """(text or None, token ids) of a prompt; safe from any thread (the tokenizer is
        only read, and releases the GIL while it encodes)."""
        return prompts.tokenize(self.tokenizer, self.model_config.vocab_size, prompt)

    @functools.cached_property
    def max_prompt_chars(self) -> int:
        """No prompt of more characters can fit max_model_len tokens."""
        return self.max_model_len * prompts.longest_token_chars(self.tokenizer)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt the model's chat template makes of `messages` (and OpenAI-style `tools`,
        and extra template variables), rendered as transformers renders it but bounded: a
        template over its time or size budget raises TemplateBudgetError, one that refuses or
        breaks on them TemplateRenderError (both ValueError). Safe from any thread."""
        return prompts.chat_prompt(
            self.tokenizer,
            messages,
            self.max_prompt_chars,
            self.model_config.architecture,
            self.model_source,
            tools,
            template_kwargs,
        )

    def add_request(
        self,
        request_id: str,
        prompt: PromptInput,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        prompt_token_ids: list[int] | None = None,
    ) -> None:
        """Queue a request. `prompt_token_ids`: `prompt`'s tokens, already computed (the server
        tokenizes off this thread); only checked against the vocabulary here, and the
        outputs still carry `prompt` as the text."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        params.check_vocab(self.model_config.vocab_size)
        if prompt_token_ids is None:
            text, ids = self.tokenize(prompt)
        else:
            if not isinstance(prompt, str):
                raise ValueError("prompt_token_ids go with the prompt's text (a str)")
            text = prompt
            ids = prompts.check_token_ids(prompt_token_ids, self.model_config.vocab_size)
        if not ids:
            raise ValueError("prompt is empty after tokenization")
        if len(ids) + 1 > self.max_model_len:
            raise ValueError(
                f"prompt of {len(ids)} tokens leaves no room to generate: "
                f"prompt + 1 must be <= max_model_len {self.max_model_len}"
            )
        if len(ids) + 1 > self.max_seq_len:
            raise ValueError(
                f"prompt of {len(ids)} tokens cannot fit the KV pool: prompt + 1 must be <= "
                f"{self.max_seq_len} tokens ({self.allocator.num_blocks} blocks of "
                f"{self.config.block_size})"
            )
        grammar = None
        if params.structured_outputs is not None:
            # A cache hit when the server compiled it first, off its event loop.
            grammar = self.grammars.compile(params.structured_outputs)
        arrival = self._now() if arrival_time is None else arrival_time
        request = Request(request_id, text, ids, params, RequestMetrics(arrival))
        request.sequences = [self._new_sequence(request, i, grammar) for i in range(params.n)]
        self.requests[request_id] = request
        self.trace.on_request(self.num_steps, request)
        for seq in request.sequences:
            self.scheduler.announce(seq)
        if self.config.allocator == "contiguous":
            # The naive allocator shares nothing: every sample prefills into its own reservation.
            for seq in request.sequences:
                self.scheduler.add(seq)
            return
        # n > 1: only the first sample prefills; the others fork from it once the prompt's K/V
        # exist, sharing its blocks (copy-on-write) instead of computing the prompt n times.
        self.scheduler.add(request.sequences[0])
        request.pending_forks = request.sequences[1:]

    def _new_sequence(
        self, request: Request, index: int, grammar: CompiledGrammar | None
    ) -> Sequence:
        params, ids = request.params, request.prompt_token_ids
        return Sequence(
            request=request,
            index=index,
            token_ids=list(ids),
            detokenizer=IncrementalDetokenizer(self.tokenizer, ids, params.skip_special_tokens),
            generator=self._sample_generator(params.seed, index),
            logprobs=[] if params.logprobs is not None else None,
            grammar=grammar.matcher() if grammar is not None else None,
        )

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its blocks; returns its final output (None if unknown)."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        for seq in request.sequences:
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self.scheduler.finish(seq)
        request.metrics.finished_time = self._now()
        self.trace.on_finish(self.num_steps, request)
        return request.output()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- stepping ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once, sample; returns outputs of requests that progressed."""
        self._begin_step()
        started, timer = self._now(), time.perf_counter()
        batch = self.scheduler.schedule()
        if not batch.items:
            return []
        shape = StepShape.of(batch.items)
        for seq, _ in batch.items:
            if seq.request.metrics.first_scheduled_time is None:
                seq.request.metrics.first_scheduled_time = started
                seq.request.first_scheduled_step = self.num_steps + 1
        masks = self._start_masks(batch)
        seqs, logits = self._run(batch)
        touched: dict[str, Request] = {}
        stepped = [seq for seq, _ in batch.items]
        if seqs:
            seqs, logits = self._fork_pending_samples(seqs, logits)
            rows = [self._sampling_row(s) for s in seqs]
            if masks is not None or any(s.grammar is not None for s in seqs):
                self._add_masks(rows, seqs, masks.result() if masks is not None else {})
            results = self._sample(logits, rows)
            now = self._now()
            for seq, result in zip(seqs, results, strict=True):
                if isinstance(result, Exception):
                    self._fail(seq, result)
                else:
                    self._append_token(seq, result, now)
                touched[seq.request.request_id] = seq.request
            stepped += [s for s in seqs if s.index > 0]  # forked samples appear this step
        self.emit_progress(stepped)
        counts = PoolCounts.of(self.allocator, self.scheduler, self.observers.counters)
        self.trace.on_step(self.num_steps, started, time.perf_counter() - timer, shape, counts)
        outputs = []
        for request in touched.values():
            outputs.append(self._output_of(request))
            if request.is_finished:
                request.metrics.finished_time = now
                del self.requests[request.request_id]
                self.trace.on_finish(self.num_steps, request)
        return outputs

    def admit(self, seq: Sequence) -> bool:
        """Admit a sequence built outside add_request (a beam search's prompt) into the next
        step, with room for all its tokens; False, changing nothing, when the pool is full."""
        self._begin_step()
        return self.scheduler.admit(seq)

    def step_sequences(self, seqs: list[Sequence]) -> torch.Tensor:
        """One step over exactly `seqs` (beam search's step), each computing all its uncomputed
        tokens: the logits of each one's last token, in the order given. NoFreeBlocksError,
        preempting nothing, when the pool cannot hold them; end the step with emit_progress."""
        self._begin_step()
        self.trace.note("a beam search ran, which a what-if replay leaves out")
        sampled, logits = self._run(self.scheduler.schedule_exactly(seqs))
        row = {seq.seq_id: i for i, seq in enumerate(sampled)}
        return logits[torch.tensor([row[s.seq_id] for s in seqs], device=logits.device)]

    def emit_progress(self, seqs: list[Sequence]) -> None:
        """Tell observers how far each sequence got this step (fills of its last blocks)."""
        seen: dict[int, tuple[int, int, int]] = {}
        for seq in seqs:
            seen[seq.seq_id] = (seq.seq_id, seq.num_tokens, seq.num_computed_tokens)
        self.observers.events.emit(StepProgress, lens=tuple(seen.values()))

    def _output_of(self, request: Request) -> RequestOutput:
        return request.output()  # a what-if simulation, which reads none, skips building it

    def _now(self) -> float:
        """The clock of request metrics (a what-if simulation keeps its own)."""
        return time.time()

    def _begin_step(self) -> None:
        # Events from here until the step has run belong to it.
        self.observers.events.step = self.num_steps + 1

    def _run(self, batch: ScheduledBatch) -> tuple[list[Sequence], torch.Tensor]:
        self.num_steps += 1
        seqs, logits = self.runner.execute(batch)
        for seq, _ in batch.items:
            # Before sampling may finish (and free) it: a finished prompt stays reusable.
            self.allocator.cache_full_blocks(seq.seq_id, seq.token_ids, seq.num_computed_tokens)
        return seqs, logits

    def _fork_pending_samples(
        self, seqs: list[Sequence], logits: torch.Tensor
    ) -> tuple[list[Sequence], torch.Tensor]:
        """Fork the waiting samples of requests whose prompt just finished; each child samples
        its first token from the parent's logits with its own random stream."""
        if not any(s.request.pending_forks for s in seqs):
            return seqs, logits
        out_seqs, rows = [], []
        for row, parent in enumerate(seqs):
            out_seqs.append(parent)
            rows.append(row)
            for child in parent.request.pending_forks:
                self.scheduler.fork(parent, child)
                out_seqs.append(child)
                rows.append(row)
            parent.request.pending_forks = []
        return out_seqs, logits[torch.tensor(rows, device=logits.device)]

    def _start_masks(self, batch: ScheduledBatch) -> Future[dict[int, TokenMask]] | None:
        """Begin the masks of the constrained sequences this step will sample from (those
        whose last token it computes), to be ready when the forward pass is done."""
        matchers = [
            (seq.seq_id, seq.grammar)
            for seq, num_new in batch.items
            if seq.grammar is not None and seq.num_computed_tokens + num_new >= seq.num_tokens
        ]
        return self.step_masks.start(matchers) if matchers else None

    def _add_masks(
        self, rows: list[SamplingRow], seqs: list[Sequence], masks: dict[int, TokenMask]
    ) -> None:
        late = [(s.seq_id, s.grammar) for s in seqs if s.grammar and s.seq_id not in masks]
        if late:  # samples forked this step: the same state as their parent, filled now
            masks.update(self.step_masks.fill(late))
        for row, seq in zip(rows, seqs, strict=True):
            row.grammar_mask = masks.get(seq.seq_id)

    def _sample(
        self, logits: torch.Tensor, rows: list[SamplingRow]
    ) -> list[SampleResult | Exception]:
        return sample_each(self.sampler, logits, rows)

    def _sampling_row(self, seq: Sequence) -> SamplingRow:
        params = seq.request.params
        banned: set[int] = set()
        if seq.num_output_tokens < params.min_tokens:
            # vLLM masks EOS (ignore_eos or not) and stop_token_ids until min_tokens.
            banned = self.eos_token_ids | set(params.stop_token_ids or ())
        return SamplingRow(params, seq.token_ids, seq.generator, seq.num_prompt_tokens, banned)

    def _fail(self, seq: Sequence, error: Exception) -> None:
        """Finish a sequence whose step failed: its blocks are freed, its output says why."""
        seq.error = f"{type(error).__name__}: {error}"
        seq.finish_reason = "abort"
        self.scheduler.finish(seq)

    def _append_token(self, seq: Sequence, result: SampleResult, now: float) -> None:
        seq.request.first_token_step = seq.request.first_token_step or self.num_steps
        reason = seq.append_token(result, now, self.eos_token_ids, self.max_seq_len)
        if seq.grammar is not None and reason != "stop":
            if not seq.grammar.accept(result.token_id):
                self._fail(seq, ValueError(f"the grammar rejected a token: {seq.grammar.error}"))
                return
            if seq.grammar.is_terminated and reason is None:
                seq.text_decoder.flush()
                reason = "stop"  # the output is complete: only EOS could follow
        if reason is not None:
            seq.finish_reason = reason
            self.scheduler.finish(seq)

    def _sample_generator(self, seed: int | None, index: int) -> torch.Generator | None:
        if seed is None:
            return None
        # Each of the n samples gets its own reproducible stream.
        stream = (seed * 1_000_003 + index) & (2**63 - 1)  # any int seed maps into range
        return torch.Generator(device=self.model.device).manual_seed(stream)

    # ---- introspection -------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return inspection.engine_stats(self)

    def kv_snapshot(self) -> KVSnapshot:
        """An immutable copy of the pool: per-block arrays, per-sequence tables, metrics."""
        return self.observers.snapshot()

    def shadow_snapshot(self) -> KVSnapshot | None:
        """The same traffic on the naive contiguous allocator (None in contiguous mode)."""
        return self.observers.shadow_snapshot()

    def block_contents(self, block_id: int) -> dict[str, Any]:
        """What one physical block holds: its token ids and their text, and who holds it."""
        return inspection.block_contents(self, block_id)

    def block_hash(self, block_id: int) -> tuple[int, int | None, tuple[int, ...], int] | None:
        """(hash, parent hash, token ids, KV group) of a block holding a reusable prefix."""
        return inspection.block_hash(self, block_id)

    def subscribe_kv_events(self, listener: Callable[[KVEvent], None]) -> None:
        """Call listener(event) for every KV event from now on, in the engine's thread (the
        kinds of engine.kv.events, tagged by `event.kind` as in the recording format)."""
        self.observers.events.subscribe(listener)

    def unsubscribe_kv_events(self, listener: Callable[[KVEvent], None]) -> None:
        self.observers.events.unsubscribe(listener)

    def start_recording(self, path: str | Path) -> None:
        """Write every KV event from now on to a JSON-lines file (replay with engine.kv.replay)."""
        self.stop_recording()
        if self.has_unfinished_requests():
            raise ValueError("start recording on an idle engine, so the replay starts from empty")
        trace = {"trace": self.trace.settings.to_json(), "trace_start_step": self.num_steps}
        self.observers.start_recording(path, str(self.model_source), trace)
        self.trace.writer = self.observers.recorder

    def stop_recording(self) -> None:
        self.trace.writer = None
        self.observers.stop_recording()
