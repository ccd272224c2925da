"""The HF transformers baseline: `generate` on static left-padded batches of the same requests."""

from __future__ import annotations

import importlib.util
import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList

from kvscope.app.bench.engine_bench import DecodeTiming
from kvscope.engine.model.loader import default_model_path

if TYPE_CHECKING:
    from transformers import GenerationMixin, PreTrainedModel

    class CausalLM(PreTrainedModel, GenerationMixin):
        """What AutoModelForCausalLM builds: a model with `generate`, which PreTrainedModel
        itself no longer has."""


@dataclass
class HFRunResult:
    num_requests: int
    batch_size: int
    useful_tokens_by_request: list[int]  # in workload order
    useful_tokens: int
    generated_slots: int  # rows x new-token columns: everything the batch computed
    wasted_token_share: float  # padding after EOS and tokens past a request's own budget
    wall_s: float
    useful_tokens_per_s: float


def load_hf_model(path: Path | None = None) -> CausalLM:
    """The bundled GGUF through transformers, float32 (HF needs `accelerate` to read GGUF)."""
    if importlib.util.find_spec("accelerate") is None:
        raise ModuleNotFoundError(
            "the HF baseline needs the 'accelerate' package to load GGUF files: "
            "`pip install accelerate`, or run `kvscope bench --skip-hf`"
        )
    path = path or default_model_path()
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    return model.eval()


def useful_token_count(generated: list[int], max_tokens: int, eos_ids: set[int]) -> int:
    """Tokens up to and including the first EOS, capped at the request's own max_tokens."""
    for i, token in enumerate(generated[:max_tokens]):
        if token in eos_ids:
            return i + 1
    return min(len(generated), max_tokens)


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask with padding on the left, as decoder-only generate expects."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def generate_new_tokens(
    model: CausalLM,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos_ids: set[int],
    pad_id: int,
    **generate_kwargs,
) -> torch.Tensor:
    """Greedy `generate` on one left-padded batch; returns only the new tokens, [B, G]."""
    ids, mask = left_pad(prompts, pad_id)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=sorted(eos_ids),
            pad_token_id=pad_id,
            **generate_kwargs,
        )
    return out[:, ids.shape[1] :]


def run_hf_batched(
    model: CausalLM,
    prompts: list[list[int]],
    max_tokens: list[int],
    eos_ids: set[int],
    pad_id: int,
    batch_size: int,
) -> HFRunResult:
    """Static batches in request order; each runs to the largest max_tokens among its rows.

    Batch size 1 is the one-request-at-a-time baseline: each request gets exactly its own budget.
    """
    useful: list[int] = []
    slots = 0
    start = time.perf_counter()
    for lo in range(0, len(prompts), batch_size):
        budgets = max_tokens[lo : lo + batch_size]
        new = generate_new_tokens(
            model, prompts[lo : lo + batch_size], max(budgets), eos_ids, pad_id
        )
        slots += new.numel()
        for row, budget in zip(new.tolist(), budgets, strict=True):
            useful.append(useful_token_count(row, budget, eos_ids))
    wall = time.perf_counter() - start
    return HFRunResult(
        num_requests=len(prompts),
        batch_size=batch_size,
        useful_tokens_by_request=useful,
        useful_tokens=sum(useful),
        generated_slots=slots,
        wasted_token_share=1.0 - sum(useful) / slots,
        wall_s=wall,
        useful_tokens_per_s=sum(useful) / wall,
    )


class _StepClock(StoppingCriteria):
    """Never stops generation; notes the time each new token is ready."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def measure_hf_decode(
    model: CausalLM, prompt: list[int], steps: int, eos_ids: set[int], pad_id: int
) -> DecodeTiming:
    """Batch-1 `generate` of 1 + `steps` tokens; the gaps between tokens are the decode steps."""
    clock = _StepClock()
    generate_new_tokens(
        model,
        [prompt],
        steps + 1,
        eos_ids,
        pad_id,
        min_new_tokens=steps + 1,  # EOS suppressed, like ignore_eos in our engine's measurement
        stopping_criteria=StoppingCriteriaList([clock]),
    )
    step_s = [b - a for a, b in itertools.pairwise(clock.times)]
    return DecodeTiming(step_s, len(prompt) + (steps + 1) / 2)
