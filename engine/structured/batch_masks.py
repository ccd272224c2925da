"""A sampling batch's structured-output masks, as the sampler applies them.

vLLM masks a grammar's disallowed tokens before every other logits processor. Each processor
after it (logit_bias, the stop-token ban, allowed_token_ids, the penalties, temperature) works
token by token and keeps -inf at -inf, so the sampler may apply the masks last instead, on the
tensor temperature scaling creates anyway: the same scores, and no copy of the whole batch's
logits for a step where only some rows are constrained.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from kvscope.engine.structured.step_masks import TokenMask


class BatchMasks:
    """The constrained rows of a batch (their positions in it) and what each adds to its
    logits: `additive[j]` (0 or -inf per column, engine/structured/step_masks.py) is row
    `rows[j]`'s."""

    def __init__(self, rows: list[int], additive: list[torch.Tensor]) -> None:
        self.rows = rows
        self.additive = additive

    @classmethod
    def of(
        cls, masks: Sequence[TokenMask | None], vocab: int, device: torch.device
    ) -> BatchMasks | None:
        """From each row's mask (None: unconstrained): None where no row is constrained;
        ValueError where a grammar allows no token."""
        constrained, additive = [], []
        for i, mask in enumerate(masks):
            if mask is None:
                continue
            row_add, allows_any = mask.additive, mask.allows_any
            if row_add.shape[0] != vocab:  # filled for the model's logits: only a test differs
                row_add = _fit(row_add, vocab)
                allows_any = bool(row_add.isfinite().any())
            if not allows_any:
                # Fails the batch; sample_each then fails this request alone.
                raise ValueError("the structured-output grammar allows no next token")
            constrained.append(i)
            additive.append(row_add.to(device))
        return cls(constrained, additive) if constrained else None

    def apply_(self, scores: torch.Tensor) -> None:
        """Add each constrained row's mask, in place (x + 0 is x, x - inf is -inf): `scores`
        must be a tensor the sampler owns, never the raw logits (logprobs are read from those)."""
        for i, additive in zip(self.rows, self.additive, strict=True):
            scores[i].add_(additive)

    def allowed_any(self, j: int, scores_row: torch.Tensor) -> bool:
        """Whether row `rows[j]` keeps a finite score its grammar allows."""
        return bool((scores_row + self.additive[j]).isfinite().any())


def _fit(additive: torch.Tensor, vocab: int) -> torch.Tensor:
    """A mask row cut or padded (never allowed) to `vocab` columns."""
    if additive.shape[0] >= vocab:
        return additive[:vocab]
    return torch.nn.functional.pad(additive, (0, vocab - additive.shape[0]), value=-math.inf)
