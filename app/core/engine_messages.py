"""The messages the engine worker sends to the GUI thread: immutable copies, never engine state.

Each is built on the worker thread (the only one that touches the engine) and read on the GUI
thread, so every field is a plain value or a snapshot the engine no longer writes to.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kvscope.app.core.settings import EngineSettings
from kvscope.engine.kv.snapshot import KVSnapshot


@dataclass(frozen=True)
class ReplyUpdate:
    """A request's progress: cumulative text of each of its n samples."""

    request_id: str
    texts: list[str]
    finish_reasons: list[str | None]
    finished: bool
    num_generated: int  # tokens over all samples
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache
    ttft_s: float | None  # arrival to first token
    tokens_per_s: float | None  # generated tokens / time since the first token
    dropped_turns: int = 0  # oldest turns left out to fit the context
    sample_tokens: list[int] = field(default_factory=list)  # tokens of each sample
    arrival_time: float | None = None  # when the engine took the request (time.time())

    @classmethod
    def from_output(cls, output, dropped_turns: int) -> ReplyUpdate:
        """The update for an engine RequestOutput, with its timing turned into rates."""
        generated = sum(len(c.token_ids) for c in output.outputs)
        m = output.metrics
        ttft = tps = None
        if m is not None and m.first_token_time is not None:
            ttft = max(0.0, m.first_token_time - m.arrival_time)
            end = m.finished_time or time.time()
            if end > m.first_token_time and generated > len(output.outputs):
                # The first token of each sample came with the prompt; the rest are decode.
                tps = (generated - len(output.outputs)) / (end - m.first_token_time)
        return cls(
            request_id=output.request_id,
            texts=[c.text for c in output.outputs],
            finish_reasons=[c.finish_reason for c in output.outputs],
            finished=output.finished,
            num_generated=generated,
            prompt_tokens=len(output.prompt_token_ids),
            cached_tokens=output.num_cached_tokens,
            ttft_s=ttft,
            tokens_per_s=tps,
            dropped_turns=dropped_turns,
            sample_tokens=[len(c.token_ids) for c in output.outputs],
            arrival_time=m.arrival_time if m is not None else None,
        )

    def metrics(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "generated_tokens": self.num_generated,
            "ttft_s": self.ttft_s,
            "tokens_per_s": self.tokens_per_s,
            "dropped_turns": self.dropped_turns,
            "finish_reason": self.finish_reasons[0] if self.finish_reasons else None,
            # Per sample, so a bubble showing one of n samples can give that sample's figures.
            "sample_tokens": list(self.sample_tokens),
            "finish_reasons": list(self.finish_reasons),
        }


@dataclass(frozen=True)
class ContextUsage:
    """How much of the context the chat would take if sent now, for the composer's meter."""

    ticket: int  # the request it answers: only the newest is shown
    used: int  # prompt tokens: system prompt + history + the draft, templated
    limit: int  # the engine's max_seq_len: max_model_len, or less when the pool is smaller
    reserve: int  # context the reply needs free besides (see context_fit.reply_reserve)


@dataclass(frozen=True)
class RecordingState:
    """The answer to a record start or stop: what is being recorded now, and any refusal."""

    recording: str  # the session file being written; "" when not recording
    path: str  # the file this answer is about (the one started, stopped or refused)
    error: str = ""  # why it did not start


@dataclass(frozen=True)
class ServerState:
    """The answer to a server start or stop (Engine ▸ Serve the engine)."""

    url: str  # the OpenAI base URL being served ("http://127.0.0.1:8000/v1"); "" when not
    error: str = ""  # why it did not start, or why it stopped


@dataclass(frozen=True)
class Telemetry:
    """One picture of the pool for the block map and the status bar."""

    paged: KVSnapshot
    shadow: KVSnapshot | None  # the naive contiguous allocator replaying the same traffic
    stats: dict
    device_memory: dict | None
    timestamp: float = field(default_factory=time.time)


@dataclass(frozen=True)
class EngineInfo:
    """What the status bar and the settings dialog show about the running engine."""

    model_source: str
    model_name: str
    architecture: str
    num_parameters: int
    device: str
    dtype: str
    kv_dtype: str
    kv_bytes_per_token: int
    block_size: int
    num_blocks: int
    max_model_len: int
    max_seq_len: int
    settings: EngineSettings
    weight_bytes: int = 0  # as held at run time
    weight_format: str = ""  # "Q4_K+Q6_K", "int8", "float32"
    weight_layout: str = ""  # "cpu-int4", "triton", "dense", ...
    base_model: bool = False  # no chat template and not named instruct: chats continue text

    @classmethod
    def of(cls, llm, settings: EngineSettings) -> EngineInfo:
        """Read from a built LLM (on the worker thread) and the settings it was built from."""
        from kvscope.engine.model.templates.fallbacks import is_completion_template
        from kvscope.engine.sizing import planner
        from kvscope.engine.sizing.weight_fit import count_parameters

        engine = llm.engine
        mc = engine.model_config
        config = engine.config
        kv_dtype = planner.dtype_name(config.kv_torch_dtype)
        kv_bytes = planner.bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim, kv_dtype)
        stats = llm.stats()
        return cls(
            model_source=str(engine.model_source),
            model_name=mc.name or str(engine.model_source),
            architecture=mc.architecture,
            num_parameters=count_parameters(mc),
            device=str(config.torch_device),
            dtype=str(config.torch_dtype).removeprefix("torch."),
            kv_dtype=kv_dtype,
            kv_bytes_per_token=kv_bytes,
            block_size=config.block_size,
            num_blocks=stats["kv_blocks_total"],
            max_model_len=engine.max_model_len,
            max_seq_len=engine.max_seq_len,
            settings=settings,
            weight_bytes=stats["weight_bytes"],
            weight_format=stats["weight_format"],
            weight_layout=stats["weight_layout"],
            base_model=is_completion_template(getattr(engine.tokenizer, "chat_template", None)),
        )
