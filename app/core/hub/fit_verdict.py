"""Whether a model fits this machine, from its header alone: the engine's own arithmetic.

The figures are the ones the engine's load uses, so a verdict and a load cannot disagree: the
weights as the engine will keep them, with their load peak, against the memory free on the
device it would pick (engine.sizing.weight_fit, the settings dialog's check), and the KV pool
from the model's real layout (engine.sizing.planner: GQA, sliding-window layers that keep only
their window, the KV dtype). What is left beside the weights is the KV pool: the longest
context one sequence can have (what the engine caps a sequence at for that pool,
KVLayout.max_tokens_for_blocks), and how many sequences of a typical length fit at once.

On a CPU the engine's fit check counts the weights, their load peak, the runtime and the KV
pool together against MemAvailable; a pool of `kv_cache_bytes` (passed as kv_cache_memory)
gives the promised context. On a GPU the engine sizes the pool itself from what is left after
the weights and one step's activations, which only a load measures: the context there is an
upper bound, and the note says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.engine.config import EngineConfig
from kvscope.engine.model.gguf.remote import RemoteGGUF
from kvscope.engine.sizing import planner
from kvscope.engine.sizing.weight_fit import resolve_for_weights, weight_fit

TYPICAL_CONTEXT = 4096  # a chat's length, for "how many sequences fit"


@dataclass(frozen=True)
class FitVerdict:
    fits: bool  # the engine can run it here with one sequence of typical_context beside it
    device: str  # "cpu" | "cuda:0": where the engine would load it (device="auto")
    free_bytes: int  # free on that device (MemAvailable, or the GPU's free x utilization)
    weight_bytes: int  # the weights as the engine keeps them, without the load peak
    max_context: int  # the longest sequence the memory left can hold (<= the model's)
    typical_context: int  # 4,096 tokens, or the model's context when shorter
    sequences: int  # sequences of typical_context that fit at once beside the weights
    note: str  # why, in words
    kv_cache_bytes: int = 0  # the KV pool max_context needs (kv_cache_memory for a CPU load)
    runnable: bool = True  # False: the engine cannot run this file at all (see note)


def fit_verdict(model: RemoteGGUF, config: EngineConfig | None = None) -> FitVerdict:
    """The verdict for `model` under `config` (default: the engine's defaults, device auto)."""
    mc = model.config
    header = (model.shapes, model.kinds)
    config = resolve_for_weights(config or EngineConfig(), header)
    fit = weight_fit(config, header, mc.tie_word_embeddings)
    on_cpu = config.torch_device.type == "cpu"
    device_name = _device_name(config)
    limit = min(config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings)
    typical = min(TYPICAL_CONTEXT, limit)
    usable = fit.usable_bytes
    weights = fit.plan.runtime_bytes
    runnable = model.problem is None
    if usable is None:
        why = f"cannot read the free memory of {device_name}, so there is nothing to fit against"
        return FitVerdict(False, device_name, 0, weights, 0, typical, 0, why, runnable=runnable)
    kv_dtype = planner.dtype_name(config.kv_torch_dtype)
    layout = planner.kv_layout_of(mc, config.block_size)
    per_block = config.block_size * planner.bytes_per_token(
        layout.group_size, mc.num_kv_heads, mc.head_dim, kv_dtype
    )
    chunk = config.batched_tokens_limit
    load_need = fit.plan.total_bytes + fit.overhead_bytes
    # What stays for the KV pool (see the module docstring for the CPU / GPU difference).
    blocks = max(usable - (load_need if on_cpu else weights), 0) // per_block
    max_context = sequences = held = 0
    if load_need <= usable:
        max_context = layout.max_tokens_for_blocks(blocks, chunk, limit)
        held = layout.max_blocks_held(max_context, min(chunk, max_context)) if max_context else 0
        sequences = blocks // layout.max_blocks_held(typical, min(chunk, typical))
    where = "RAM" if on_cpu else "GPU memory"
    loading = (
        f"{_gib(weights)} of weights ({'+'.join(fit.plan.formats)}), "
        f"{_gib(fit.plan.load_peak_bytes)} more while loading"
        + (f", {_gib(fit.overhead_bytes)} for the runtime" if fit.overhead_bytes else "")
    )
    if load_need > usable:
        note = f"does not fit: loading needs {_gib(load_need)} of {where} ({loading}); "
        note += f"{_gib(usable)} is free"
    else:
        note = f"{loading}, in {_gib(usable)} of free {where}; "
        note += _context_sentence(model, kv_dtype, max_context, limit, typical, sequences)
        if not on_cpu:
            note += " (an upper bound: one step's activations are measured at load)"
        if sequences < 1:
            note = f"does not fit a {typical:,}-token sequence: {note}"
    if not runnable:
        note = f"cannot run here: {model.problem}. Its size: {note}"
    return FitVerdict(
        fits=runnable and sequences >= 1,
        device=device_name,
        free_bytes=usable,
        weight_bytes=weights,
        max_context=max_context,
        typical_context=typical,
        sequences=sequences,
        note=note,
        kv_cache_bytes=held * per_block,
        runnable=runnable,
    )


def refused_verdict(reason: str, config: EngineConfig | None = None) -> FitVerdict:
    """The verdict on a file the engine cannot even size (not GGUF, an architecture it lacks)."""
    name = _device_name(config or EngineConfig())
    return FitVerdict(False, name, 0, 0, 0, 0, 0, f"cannot run here: {reason}", runnable=False)


def _device_name(config: EngineConfig) -> str:
    device = config.torch_device
    return "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"


def _context_sentence(
    model: RemoteGGUF, kv_dtype: str, max_context: int, limit: int, typical: int, sequences: int
) -> str:
    mc = model.config
    per_token = planner.sequence_kv_bytes(mc, max(max_context, 1), kv_dtype) / max(max_context, 1)
    windows = [w for w in mc.layer_windows() if w is not None]
    kind = f"{per_token / 1024:,.0f} KiB of {kv_dtype} KV per token"
    if windows:
        kind += (
            f", {len(windows)} of {mc.num_layers} layers keep only a {max(windows):,}-token window"
        )
    capped = ", the model's limit" if max_context == limit else ""
    return (
        f"one sequence can hold {max_context:,} tokens{capped} ({kind}); "
        f"{sequences:,} sequence{'s' if sequences != 1 else ''} of {typical:,} tokens fit at once"
    )


def _gib(n: int) -> str:
    """Bytes as a person reads them: GiB, or MiB below one GiB."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
