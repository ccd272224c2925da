"""A what-if schedules as the recorded device's engine does: the CPU's cap on prompt tokens
beside decodes applies to a CPU trace only."""

from __future__ import annotations

import dataclasses

from kvscope.engine.config import CPU_PREFILL_BESIDE_DECODES
from kvscope.engine.trace.records import TraceSettings
from kvscope.engine.whatif.settings import recorded_config
from kvscope.engine.whatif.sim_engine import SimEngine

CPU_TRACE = TraceSettings(
    model="m.gguf",
    num_layers=2,
    num_kv_heads=1,
    head_dim=8,
    layer_windows=(None, None),
    kv_dtype="bfloat16",
    num_blocks=64,
    block_size=16,
    max_num_seqs=8,
    max_batched_tokens=512,
    max_model_len=256,
    enable_prefix_caching=True,
    allocator="paged",
    release_window_blocks=True,
    model_context=256,
    device="cpu",
)


def _cap(settings: TraceSettings) -> int | None:
    engine = SimEngine(recorded_config(settings), settings, {}, vocab_size=32)
    return engine.scheduler.prefill_beside_decodes


def test_a_cuda_trace_replays_without_the_cpu_cap():
    assert _cap(CPU_TRACE) == CPU_PREFILL_BESIDE_DECODES
    assert _cap(dataclasses.replace(CPU_TRACE, device="cuda:0")) is None
