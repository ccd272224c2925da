"""KVScope's embedded paged-attention inference engine (headless; no Qt)."""

# First, before anything loads torch: it bounds OpenMP's idle spinning (see there).
import engine.omp_spin  # noqa: F401  # isort: skip

from engine.config import EngineConfig
from engine.llm import LLM
from engine.llm_engine import LLMEngine
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from engine.sampling_params import (
    GREEDY_TEMPERATURE,
    BeamSearchParams,
    ParamError,
    SamplingParams,
)

__all__ = [
    "GREEDY_TEMPERATURE",
    "LLM",
    "BeamSearchParams",
    "CompletionOutput",
    "EngineConfig",
    "LLMEngine",
    "ParamError",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
]
