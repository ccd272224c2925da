"""A step's duration from its shape, fitted to the trace's own steps (no benchmark of its own).

    duration = fixed + p × prompt chunks + a × prefill tokens + b × prefill tokens beside decodes
               + c × decoding sequences + d × context tokens attended

`fixed` is a step's overhead (scheduling, sampling, the model's per-step cost), `p` what a
sequence's prompt chunk costs whatever its length (measured on the bundled model: 15 ms + 1.7 ms
a token from 5 to 160 tokens; without `p` the fit charged 2.3 ms a token, and a what-if with
fewer prefix hits, hence longer chunks, modelled its first tokens 13-22% late), `a` the
per-token prefill cost, `c` a decode's per-sequence cost (its matmul rows), `d` attention over the
context, and `b` what a prompt chunk costs extra when it runs beside decodes. `b` is fitted, not
assumed: it depends on the kernels (such a step leaves the CPU's fused decode path; with batched
matmuls over the chunk's rows a prompt token costs there about what it costs alone,
PERFORMANCE.md "Mixed steps"). The fit is non-negative least squares on the seconds themselves,
so the long steps that make up most of a run's time (and of a first token's wait) weigh what
they cost, and the fitted steps' durations add up (relative weighting fitted the many short
decode steps better and came out 5% short over a run). Steps over 3x the median relative error
of a first, relative fit are left out (a first step's compile, a stall). `gap_s` is the median
time between the end of a step and the start of the next one while the engine stayed busy (the
caller's loop, delivering outputs).
Its error is reported on the steps it was fitted to: the mean absolute error per step, and the
error of the whole trace's summed durations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvscope.engine.trace.records import StepShape, TracedStep

TERMS = (
    "fixed",
    "prefill_seq",
    "prefill_token",
    "mixed_prefill_token",
    "decode_seq",
    "context_token",
)
MIN_STEPS = 8  # fewer steps fit nothing: the model falls back to the trace's mean step
OUTLIER_FACTOR = 3.0
BUSY_GAP_S = 1.0  # a longer pause between steps is the engine idle, not its loop's overhead


def features(shape: StepShape) -> np.ndarray:
    mixed = shape.prefill_tokens if shape.decode_seqs else 0
    return np.array(
        [
            1.0,
            shape.prefill_seqs,
            shape.prefill_tokens,
            mixed,
            shape.decode_seqs,
            shape.context_tokens,
        ],
        dtype=np.float64,
    )


@dataclass(frozen=True)
class CostModel:
    coefficients: tuple[float, ...]  # seconds per unit of each of TERMS
    gap_s: float
    num_steps: int  # steps fitted
    mean_abs_error: float  # per step, as a share of the step's duration
    total_error: float  # (modelled - measured) / measured over the fitted steps' sum

    def step_s(self, shape: StepShape) -> float:
        """A step's modelled duration, plus the loop's gap before the next one."""
        return float(features(shape) @ np.asarray(self.coefficients)) + self.gap_s

    def describe(self) -> str:
        c = dict(zip(TERMS, self.coefficients, strict=True))
        return (
            f"step = {c['fixed'] * 1e3:.1f} ms + {c['prefill_seq'] * 1e3:.1f} ms/prompt chunk + "
            f"{c['prefill_token'] * 1e6:.0f} µs/prompt token "
            f"(+{c['mixed_prefill_token'] * 1e6:.0f} beside decodes) + "
            f"{c['decode_seq'] * 1e3:.2f} ms/decode + {c['context_token'] * 1e6:.2f} µs/context "
            f"token, gap {self.gap_s * 1e3:.1f} ms; fitted to {self.num_steps} steps: "
            f"{100 * self.mean_abs_error:.0f}% mean error per step, "
            f"{100 * self.total_error:+.1f}% over their sum"
        )

    @classmethod
    def fit(cls, steps: tuple[TracedStep, ...] | list[TracedStep]) -> CostModel:
        steps = [s for s in steps if s.duration > 0]
        gap = _busy_gap(steps)
        if len(steps) < MIN_STEPS:
            mean = float(np.mean([s.duration for s in steps])) if steps else 0.0
            coefficients = (mean,) + (0.0,) * (len(TERMS) - 1)
            return cls(coefficients, gap, len(steps), float("nan"), float("nan"))
        x = np.stack([features(s.shape) for s in steps])
        y = np.array([s.duration for s in steps])
        # Outliers are found by a fit on relative error, which no single stall can pull.
        rough = _nnls(x / y[:, None], np.ones(len(y)))
        rel = np.abs(x @ rough - y) / y
        keep = rel <= OUTLIER_FACTOR * max(float(np.median(rel)), 0.02)
        if keep.sum() < MIN_STEPS:
            keep[:] = True
        coef = _nnls(x[keep], y[keep])
        modelled = x @ coef
        return cls(
            tuple(float(c) for c in coef),
            gap,
            len(steps),
            float(np.mean(np.abs(modelled - y) / y)),
            float((modelled.sum() - y.sum()) / y.sum()),
        )


def _busy_gap(steps: list[TracedStep]) -> float:
    gaps = [
        b.time - (a.time + a.duration)
        for a, b in zip(steps, steps[1:], strict=False)
        if b.step == a.step + 1 and 0 <= b.time - (a.time + a.duration) < BUSY_GAP_S
    ]
    return float(np.median(gaps)) if gaps else 0.0


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min ||a x - b|| with x >= 0 (Lawson-Hanson active set; a handful of unknowns)."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    for _ in range(3 * n):
        w = a.T @ (b - a @ x)
        if passive.all() or w[~passive].max(initial=-np.inf) <= 1e-12:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg] + 1e-300))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
    return x
