"""KVScope's embedded paged-attention inference engine (headless; no Qt)."""

# First, before anything loads torch: it bounds OpenMP's idle spinning (see there).
import kvscope.engine.omp_spin  # noqa: F401  # isort: skip

from kvscope.engine.config import EngineConfig
from kvscope.engine.llm import LLM
from kvscope.engine.llm_engine import LLMEngine
from kvscope.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from kvscope.engine.param_error import ParamError
from kvscope.engine.sampling_params import (
    GREEDY_TEMPERATURE,
    BeamSearchParams,
    SamplingParams,
)
from kvscope.engine.structured.compiler import GrammarError
from kvscope.engine.structured.params import StructuredOutputsParams, close_object_schemas

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
    "GrammarError",
    "StructuredOutputsParams",
    "close_object_schemas",
]
