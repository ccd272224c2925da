"""CountedWeights: a model's weight source that reports how much of it the build has read, so
the loading bar is determinate where the work is countable.

The share is by elements, not tensors: the embedding and the layers' matrices differ in size
by 100x and more, and a count of tensors would rush through norms and stall on the head.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

REPORT_STEP = 0.01  # a share this much above the last report is reported again


class CountedWeights:
    def __init__(self, inner: Any, report: Callable[[float], None]) -> None:
        self._inner = inner
        self._report = report
        self._sizes = {name: max(1, math.prod(shape)) for name, shape in inner.shapes().items()}
        self._total = sum(self._sizes.values()) or 1
        self._read = 0
        self._reported = -1.0

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return self._inner.shapes()

    def kinds(self) -> dict[str, str]:
        return self._inner.kinds()

    def read(self, name: str, quantization: str, dtype: torch.dtype) -> Any:
        weight = self._inner.read(name, quantization, dtype)
        self._read += self._sizes.get(name, 0)
        share = min(1.0, self._read / self._total)
        if share - self._reported >= REPORT_STEP or share == 1.0:
            self._reported = share
            self._report(share)
        return weight

    def __getattr__(self, name: str) -> Any:  # anything else a source offers, as it is
        if name.startswith("__") or name == "_inner":  # copy and pickle probe before __init__
            raise AttributeError(name)
        return getattr(self._inner, name)
