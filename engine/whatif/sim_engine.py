"""SimEngine: the real LLMEngine with the model taken out, emitting recorded tokens.

It is LLMEngine itself (a subclass): the same add_request, step, forking of parallel samples,
scheduler and allocator (paged or contiguous, prefix caching, copy-on-write, sliding-window
release, preemption), the same event stream and telemetry. Only what touches the model differs:
the runner computes nothing but moves each sequence's computed count, the sampler hands each
sample the next token it produced in the recording, a sample ends where it ended then (or
earlier, where these settings cap its length), and the clock is the simulation's.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from kvscope.engine.config import EngineConfig
from kvscope.engine.kv.events import KVEvent
from kvscope.engine.llm_engine import LLMEngine
from kvscope.engine.model.sampler import SampleResult
from kvscope.engine.pool_parts import build_pool
from kvscope.engine.scheduler import ScheduledBatch
from kvscope.engine.sequence import Request, Sequence
from kvscope.engine.structured.compiler import CompiledGrammar
from kvscope.engine.trace import TraceLog, TraceSettings
from kvscope.engine.whatif.settings import SimConfig

# A finished request's recording: each sample's output token ids, and why each one ended.
RecordedOutputs = tuple[tuple[tuple[int, ...], ...], tuple[str | None, ...]]


class _NoText:
    """A simulated sample has token ids, no text: nothing reads it but an empty output."""

    output_text = ""


class RecordedRunner:
    """ModelRunner's contract without the model: advance the computed counts, name the
    sequences that reached their last token (they sample), give no logits."""

    def execute(self, batch: ScheduledBatch) -> tuple[list[Sequence], torch.Tensor]:
        samplers = []
        for seq, n in batch.items:
            seq.num_computed_tokens += n
            if seq.num_computed_tokens == seq.num_tokens:
                samplers.append(seq)
        return samplers, torch.empty((len(samplers), 0))


class SimEngine(LLMEngine):
    # LLMEngine.__init__ loads a model; this builds the same pool parts from a SimConfig.
    def __init__(
        self,
        config: SimConfig,
        recorded: TraceSettings,
        outputs: dict[str, RecordedOutputs],
        vocab_size: int,
    ) -> None:
        self.sim = config
        self.clock = 0.0
        # The recorded tokens and reasons of every request, by id.
        self._outputs = outputs
        self.config = EngineConfig(
            device="cpu",
            block_size=config.block_size,
            num_kv_blocks=config.num_blocks,
            max_model_len=config.max_model_len,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_batched_tokens,
            enable_prefix_caching=config.enable_prefix_caching,
            allocator=config.allocator,
            release_window_blocks=config.release_window_blocks,
        )
        # No model: of its config, the engine's request checks read only the vocabulary size.
        self.model_config = SimpleNamespace(vocab_size=vocab_size)  # type: ignore[assignment]
        self.model_source = recorded.model
        self.max_model_len = config.max_model_len
        self.kv_layout = config.layout()
        # The salt only changes hash values, never which blocks match. A block map replays
        # `events` (engine.whatif.pool_at), so no snapshot telemetry and no shadow follow.
        pool = build_pool(
            self.config,
            self.kv_layout,
            config.num_blocks,
            config.max_model_len,
            recorded.model.encode(),
            with_shadow=False,
            with_snapshots=False,
        )
        self.max_seq_len, self.observers = pool.max_seq_len, pool.observers
        self.allocator, self.scheduler = pool.allocator, pool.scheduler
        # The cap on prompt tokens beside decodes is a CPU engine's (EngineConfig); this config
        # is a CPU one whatever the trace's device, and a CUDA engine schedules without it.
        if not recorded.device.startswith("cpu"):
            self.scheduler.prefill_beside_decodes = None
        self.events: list[KVEvent] | None = None
        self.runner = RecordedRunner()
        self.requests: dict[str, Request] = {}
        self.eos_token_ids: set[int] = set()
        self.num_steps = 0
        self.trace = TraceLog(recorded, max_requests=1 << 30)

    def keep_events(self) -> None:
        """Keep every KV event from now on in `events` (a block map replays them)."""
        self.events = []
        self.observers.events.subscribe(self.events.append)

    def _now(self) -> float:
        return self.clock

    # Nothing reads a simulated step's outputs: building them would cost for nothing.
    def _output_of(self, request: Request) -> None:  # type: ignore[override]
        return None

    def _new_sequence(
        self, request: Request, index: int, grammar: CompiledGrammar | None = None
    ) -> Sequence:
        # A replayed sample's tokens are recorded: a grammar it followed has nothing to mask.
        ids = request.prompt_token_ids
        return Sequence(request, index, list(ids), _NoText(), None)  # type: ignore[arg-type]

    # A simulated sample's row is the sample itself (its next token is recorded): these two
    # overrides pass sequences where the engine's pass SamplingRows, and only each other sees them.
    def _sampling_row(self, seq: Sequence) -> Sequence:  # type: ignore[override]
        return seq

    def _sample(  # type: ignore[override]
        self, logits: torch.Tensor, rows: list[Sequence]
    ) -> list[SampleResult]:
        results = []
        for seq in rows:
            produced = self._outputs[seq.request.request_id][0][seq.index]
            k = seq.num_output_tokens
            # Past its recorded tokens only a sample aborted before its first: it ends now.
            results.append(SampleResult(produced[k] if k < len(produced) else 0, 0.0, None))
        return results

    def _append_token(self, seq: Sequence, result: SampleResult, now: float) -> None:
        request = seq.request
        request.first_token_step = request.first_token_step or self.num_steps
        if request.metrics.first_token_time is None:
            request.metrics.first_token_time = now
        seq.token_ids.append(result.token_id)
        produced, reasons = self._outputs[request.request_id]
        reason = None
        if seq.num_output_tokens >= len(produced[seq.index]):
            reason = reasons[seq.index]
        elif seq.num_tokens >= self.max_seq_len:
            reason = "length"  # these settings cap it before the recording's end
        if reason is not None:
            seq.finish_reason = reason
            self.scheduler.finish(seq)
