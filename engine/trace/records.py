"""The traffic trace's records: what a replay under other settings needs of a session.

Per request its arrival (time, and the engine step it came before), its prompt's token ids and
sampling shape; at its end, the token ids each sample produced and why it stopped. Per step the
batch's shape, the step's duration and the pool's counts after it. They are typed like the KV
events (`engine.kv.events.KVEvent`: `step` and `time` first) and parse through the same checked
reader; in a session file they are lines of kind `trace_request`, `trace_finish` and `trace_step`
(format version 4), which the KV replay passes over.

`TraceSettings` is what the engine ran under (pool, block size, KV dtype, batching limits, the
model's KV shape): the recorded baseline every what-if is measured against.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from kvscope.engine.kv.events import TRACE_KIND_PREFIX, KVEvent
from kvscope.engine.kv.session_json import shown

if TYPE_CHECKING:
    from kvscope.engine.config import EngineConfig
    from kvscope.engine.kv.allocator import KVAllocator
    from kvscope.engine.kv.telemetry import PoolCounters
    from kvscope.engine.model.model_config import ModelConfig
    from kvscope.engine.scheduler import Scheduler

MAX_TOKEN_ID = (1 << 31) - 1  # ids are kept as int32 (no vocabulary comes near)
# What a header may declare, checked before a replay is sized by it: blocks as a recording's
# KV header allows (engine.kv.replay: 1.7x the largest real pool), layers 8x the deepest model's.
MAX_TRACE_BLOCKS = 1 << 24
MAX_TRACE_LAYERS = 1024


class _Computing(Protocol):
    """A scheduled sequence, as a step's shape counts it."""

    @property
    def num_computed_tokens(self) -> int: ...


class TracedEngine(Protocol):
    """What `TraceSettings.of_engine` reads of an engine (LLMEngine has it all): declared here,
    since the engine imports this module."""

    config: EngineConfig
    model_config: ModelConfig
    model_source: str
    allocator: KVAllocator
    max_model_len: int


def token_array(ids: Iterable[int]) -> array[int]:
    """Token ids as an int32 array: 4 bytes a token where a tuple of ints holds 36 (the int
    objects outlive the request in a trace). ValueError for an id out of range."""
    try:
        return array("i", ids)
    except OverflowError:
        raise ValueError(f"a token id is above {MAX_TOKEN_ID:,}") from None


@dataclass(frozen=True, slots=True)
class TracedRequest(KVEvent):
    """A request arrived: `step` is the engine's step count then (it is first schedulable in
    step + 1), `time` its arrival (wall clock)."""

    kind: ClassVar[str] = TRACE_KIND_PREFIX + "request"
    request_id: str
    prompt_token_ids: tuple[int, ...]  # in a file; an int32 array in memory
    n: int  # parallel samples
    max_tokens: int
    constrained: bool = False  # its output followed a structured-output grammar

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_token_ids", token_array(self.prompt_token_ids))


@dataclass(frozen=True, slots=True)
class TracedFinish(KVEvent):
    """A request ended in step `step` at `time`: each sample's output tokens and reason."""

    kind: ClassVar[str] = TRACE_KIND_PREFIX + "finish"
    request_id: str
    outputs: tuple[tuple[int, ...], ...]  # each an int32 array in memory
    reasons: tuple[str | None, ...]  # "stop", "length", "abort"
    first_scheduled_step: int  # 0: never scheduled (aborted while waiting)
    first_token_step: int  # 0: no token came out

    def __post_init__(self) -> None:
        object.__setattr__(self, "outputs", tuple(token_array(o) for o in self.outputs))

    @property
    def num_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)


@dataclass(frozen=True, slots=True)
class StepShape:
    """What a step computed, the cost model's inputs (engine.whatif.cost_model)."""

    prefill_tokens: int  # tokens of prompt chunks (items computing more than one token)
    prefill_seqs: int
    decode_seqs: int  # items computing one token
    context_tokens: int  # keys attended over all items: sum of each one's length after the step

    @classmethod
    def of(cls, items: Iterable[tuple[_Computing, int]]) -> StepShape:
        """The shape of a scheduled batch's (sequence, tokens) items, before they ran."""
        prefill_tokens = prefill_seqs = decode_seqs = context = 0
        for seq, n in items:
            context += seq.num_computed_tokens + n
            if n == 1:
                decode_seqs += 1
            else:
                prefill_seqs += 1
                prefill_tokens += n
        return cls(prefill_tokens, prefill_seqs, decode_seqs, context)


@dataclass(frozen=True, slots=True)
class PoolCounts:
    """The pool after a step: what the what-if compares step by step."""

    blocks_used: int
    blocks_cached: int
    running: int
    waiting: int
    preemptions: int  # cumulative
    prefix_hit_tokens: int  # cumulative

    @classmethod
    def of(cls, allocator: KVAllocator, scheduler: Scheduler, counters: PoolCounters) -> PoolCounts:
        """An engine's counts now: its allocator, scheduler and pool counters (PoolCounters)."""
        return cls(
            allocator.num_used_blocks,
            allocator.num_cached_blocks,
            len(scheduler.running),
            len(scheduler.waiting),
            counters.num_preemptions,
            counters.prefix_hit_tokens,
        )


@dataclass(frozen=True, slots=True)
class TracedStep(KVEvent):
    """Step `step` started at `time` and took `duration` seconds (schedule, model, sampling)."""

    kind: ClassVar[str] = TRACE_KIND_PREFIX + "step"
    duration: float
    prefill_tokens: int
    prefill_seqs: int
    decode_seqs: int
    context_tokens: int
    blocks_used: int
    blocks_cached: int
    running: int
    waiting: int
    preemptions: int
    prefix_hit_tokens: int

    @property
    def shape(self) -> StepShape:
        return StepShape(
            self.prefill_tokens, self.prefill_seqs, self.decode_seqs, self.context_tokens
        )

    @property
    def counts(self) -> PoolCounts:
        return PoolCounts(
            self.blocks_used,
            self.blocks_cached,
            self.running,
            self.waiting,
            self.preemptions,
            self.prefix_hit_tokens,
        )


TRACE_TYPES: dict[str, type[KVEvent]] = {
    cls.kind: cls for cls in (TracedRequest, TracedFinish, TracedStep)
}


@dataclass(frozen=True)
class TraceSettings:
    """The engine a trace was recorded on: its pool and batching, and the model's KV shape."""

    model: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    layer_windows: tuple[int | None, ...]  # each layer's sliding window, None for full
    kv_dtype: str  # torch dtype name: "float32", "bfloat16", "float16", "float8_e4m3fn"
    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_batched_tokens: int
    max_model_len: int
    enable_prefix_caching: bool
    allocator: str  # "paged" | "contiguous"
    release_window_blocks: bool
    model_context: int  # the model's own context length (max_model_len can go up to it)
    device: str = "cpu"

    @classmethod
    def of_engine(cls, engine: TracedEngine) -> TraceSettings:
        """What an LLMEngine (or the what-if's SimEngine) runs under."""
        config, mc = engine.config, engine.model_config
        return cls(
            model=str(engine.model_source),
            num_layers=mc.num_layers,
            num_kv_heads=mc.num_kv_heads,
            head_dim=mc.head_dim,
            layer_windows=tuple(mc.layer_windows()),
            kv_dtype=str(config.kv_torch_dtype).removeprefix("torch."),
            num_blocks=engine.allocator.num_blocks,
            block_size=config.block_size,
            max_num_seqs=config.max_num_seqs,
            max_batched_tokens=config.batched_tokens_limit,
            max_model_len=engine.max_model_len,
            enable_prefix_caching=config.enable_prefix_caching,
            allocator=config.allocator,
            release_window_blocks=config.release_window_blocks,
            model_context=mc.max_position_embeddings,
            device=str(config.torch_device),
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "layer_windows": list(self.layer_windows)}

    @classmethod
    def from_json(cls, record: object) -> TraceSettings:
        """The header's "trace" entry; ValueError naming the first field that is wrong."""
        if not isinstance(record, dict):
            raise ValueError("header trace settings must be an object")
        names = {f.name for f in fields(cls)}
        if not names - {"device"} <= record.keys() or not record.keys() <= names:
            raise ValueError(f"header trace settings must have the fields {sorted(names)}")
        values = dict(record)
        for name in ("model", "kv_dtype", "allocator", "device"):
            if name in values and not isinstance(values[name], str):
                raise ValueError(f"header trace {name} must be a string")
        for name in ("enable_prefix_caching", "release_window_blocks"):
            if not isinstance(values[name], bool):
                raise ValueError(f"header trace {name} must be true or false")
        for name in (
            "num_layers",
            "num_kv_heads",
            "head_dim",
            "num_blocks",
            "block_size",
            "max_num_seqs",
            "max_batched_tokens",
            "max_model_len",
            "model_context",
        ):
            high = {"num_blocks": MAX_TRACE_BLOCKS, "num_layers": MAX_TRACE_LAYERS}.get(
                name, 1 << 31
            )
            if not _count(values[name], 1, high):
                raise ValueError(
                    f"header trace {name} {shown(values[name])} is not an int in [1, {high:,}]"
                )
        windows = values["layer_windows"]
        if (
            not isinstance(windows, list)
            or len(windows) != values["num_layers"]
            or not all(w is None or _count(w, 1, 1 << 31) for w in windows)
        ):
            raise ValueError("header trace layer_windows must give each layer a window or null")
        values["layer_windows"] = tuple(windows)
        if values["allocator"] not in ("paged", "contiguous"):
            raise ValueError("header trace allocator must be 'paged' or 'contiguous'")
        return cls(**values)


def _count(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
