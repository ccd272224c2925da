"""The product's defaults for context and KV pool: one set for the window, `kvscope serve`,
`record`, `generate`, `chat` and `bench`, so a recording made on the command line replays the
app's run and a served model fits what the app showed.

The engine as a library keeps vLLM's defaults (the model's own context); the product caps it,
because a pool that must hold one sequence of the model's full 8k-128k context leaves the
paged-vs-naive comparison nothing to show and reserves more memory than a chat needs.

4,096 tokens is what Ollama and LM Studio default to, long enough for an agent's tool
prompts on the bundled model; 1 GiB of CPU KV (the engine's own CPU default) holds 2,912
blocks of 16 for the bundled model in bfloat16, 11 full contexts, so the naive allocator fits
11 reservations side by side and the paged pool visibly fits more.
"""

from __future__ import annotations

from kvscope.engine.config import DEFAULT_CPU_KV_MEMORY

DEFAULT_MAX_MODEL_LEN = 4096
DEFAULT_CPU_KV_MIB = DEFAULT_CPU_KV_MEMORY >> 20

MAX_MODEL_LEN_HELP = (
    f"longest sequence in tokens (default: {DEFAULT_MAX_MODEL_LEN:,}, or the model's context "
    "length where that is shorter)"
)


def default_max_model_len(model_context: int) -> int:
    """The product's context for a model whose own context length is `model_context`."""
    return min(DEFAULT_MAX_MODEL_LEN, model_context)
