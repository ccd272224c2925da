"""What the engine predicts a CPU load of a model file costs, for `kvscope bench --models`.

From the file's header alone (no tensor data read), with the rules the engine itself applies:
the dtype "auto" resolves to on a CPU for these weights, and the weight plan its fit check uses.
"""

from __future__ import annotations

from pathlib import Path

from kvscope.engine.config import EngineConfig
from kvscope.engine.sizing.planner import model_config, weights_header
from kvscope.engine.sizing.weight_plan import RUNTIME_OVERHEAD, plan_weights, weights_quantized


def planned_cpu_load(path: Path, quantization: str, kv_bytes: int) -> dict[str, int]:
    """Runtime weight bytes, the build's extra peak, and the total a load with a KV pool of
    `kv_bytes` needs (weights + pool + the runtime's own overhead)."""
    header = weights_header(path)
    assert header is not None  # the bench's models are GGUF files: a header always
    shapes, kinds = header
    config = EngineConfig(device="cpu", quantization=quantization)
    config.weights_quantized = weights_quantized(kinds, quantization)
    plan = plan_weights(
        shapes,
        kinds,
        quantization,
        config.torch_device,
        config.torch_dtype,
        model_config(path).tie_word_embeddings,
    )
    return {
        "weights": plan.runtime_bytes,
        "load_peak": plan.load_peak_bytes,
        "total": plan.total_bytes + kv_bytes + RUNTIME_OVERHEAD,
    }
