"""How fast this machine runs the engine: prefill tokens per second and a decode step's time by
batch size, measured from the steps the engine actually ran (no benchmark of its own).

The preemption preset (app/desktop/simulated_users/loadgen.py) sizes its load from these figures, so
that the first preemption shows within seconds on a fast GPU and on a 2-core laptop alike. The
worker times each `engine.step()` and feeds the step's KV events to `StepSpeed.on_event` (the
engine's public event stream: StepProgress says how far each sequence got), then calls
`end_step(seconds)`. A step that only prefills gives a prefill rate; one that only decodes gives a
step time for its batch size; a mixed step (prompts prefilled next to decodes, as while the preset's
users arrive) gives its own rate of tokens computed, a little below the prefill rate (the decodes'
share of the step), so the preset's prefill phase is estimated from it once seen.
"""

from __future__ import annotations

from dataclasses import dataclass

EMA = 0.3  # weight of a new sample: a few steps settle it, a first compile's slow step fades
# A shorter prefill is mostly fixed cost, not a rate: a first chat's 41-token prompt measured
# 109 tokens/s here, where 300-token prompts go at 900-3,000.
MIN_PREFILL_TOKENS = 128
WARM_UP_STEPS = 2  # an engine's first steps pay one-off costs (first shapes, first calls)
MAX_STEP_S = 30.0  # a longer "step" is a stall (a first compile), not a speed
# Until a mixed step is seen: its rate as a share of the prefill rate. A prompt token costs the
# same beside decodes as alone (PERFORMANCE.md, "Mixed steps": 0.95 ms at one thread on the
# bundled model), and a step holds at most 256 of them beside the decodes, whose own share of the
# step brings the mixed rate to ~0.85 of a prefill alone (264 tokens in ~300 ms against 0.95 ms
# a token); rounded down.
MIXED_SHARE = 0.8


@dataclass(frozen=True)
class MachineSpeed:
    """Prefill rate and decode step time (base + per_seq × batch) on this machine."""

    prefill_tokens_per_s: float
    decode_base_s: float
    decode_per_seq_s: float
    measured: bool  # False: the defaults below, nothing has run yet
    mixed_tokens_per_s: float | None = None  # steps of prefill and decodes together, once seen

    @property
    def batch_prefill_tokens_per_s(self) -> float:
        """Prompts prefilled while others decode: the mixed rate where measured, else a share
        of the prefill rate as measured here (see MIXED_SHARE)."""
        mixed = self.mixed_tokens_per_s or self.prefill_tokens_per_s * MIXED_SHARE
        return min(self.prefill_tokens_per_s, mixed)

    def decode_step_s(self, batch: int) -> float:
        return self.decode_base_s + self.decode_per_seq_s * max(1, batch)

    def describe(self) -> str:
        how = "measured here" if self.measured else "assumed: nothing has run yet"
        mixed = self.mixed_tokens_per_s
        beside = f" ({mixed:,.0f} next to decodes)" if mixed else ""
        return (
            f"prefill {self.prefill_tokens_per_s:,.0f} tokens/s{beside}, a decode step of 8"
            f" {self.decode_step_s(8) * 1000:,.0f} ms ({how})"
        )


# The bundled model on a 2-core CPU (measured: prefill 390 tokens/s; decode steps of 1, 4, 8
# and 16 sequences 15, 24, 36 and 63 ms): a cautious guess until this machine has run a step.
DEFAULT_SPEED = MachineSpeed(300.0, 0.013, 0.0035, measured=False, mixed_tokens_per_s=120.0)


class StepSpeed:
    """Accumulates one step's computed tokens from its events, then its time (see module)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._computed: dict[int, int] = {}  # seq id -> tokens computed as of its last step
        self._prefill = 0  # this step's prefill tokens, so far
        self._decode = 0  # this step's decoding sequences, so far
        self._prefill_rate: float | None = None
        self._mixed_rate: float | None = None
        self._steps = 0
        self._decode_s: dict[int, float] = {}  # batch size -> smoothed step time

    def on_event(self, event) -> None:
        """A KV event from the engine's thread (subscribe_kv_events)."""
        kind = event.kind
        if kind == "step_progress":
            for seq_id, _num_tokens, computed in event.lens:
                before = self._computed.get(seq_id, 0)
                grew = computed - before
                if grew == 1 and before > 0:
                    self._decode += 1
                elif grew > 0:
                    self._prefill += grew
                self._computed[seq_id] = computed
        elif kind == "prefix_cache_hit" and event.group == 0:
            # Adopted, not computed: the step after counts only what it computes.
            cached = (event.start + len(event.blocks)) * self.block_size
            self._computed[event.seq_id] = max(self._computed.get(event.seq_id, 0), cached)
        elif kind == "sequence_forked" and event.group == 0:
            self._computed[event.seq_id] = self._computed.get(event.parent, 0)
        elif kind == "sequence_preempted":
            self._computed[event.seq_id] = 0  # recomputed from scratch: a prefill again
        elif kind == "sequence_finished":
            self._computed.pop(event.seq_id, None)

    def end_step(self, seconds: float) -> None:
        """The step whose events came since the last call took `seconds`."""
        prefill, decode = self._prefill, self._decode
        self._prefill = self._decode = 0
        self._steps += 1
        if self._steps <= WARM_UP_STEPS or not 0 < seconds <= MAX_STEP_S:
            return
        if prefill >= MIN_PREFILL_TOKENS and decode == 0:
            self._prefill_rate = _smooth(self._prefill_rate, prefill / seconds)
        elif decode > 0 and prefill == 0:
            self._decode_s[decode] = _smooth(self._decode_s.get(decode), seconds)
        elif decode > 0 and prefill >= MIN_PREFILL_TOKENS // 4:  # short prompts count here
            self._mixed_rate = _smooth(self._mixed_rate, (prefill + decode) / seconds)

    def speed(self) -> MachineSpeed:
        """The figures so far; defaults for what has not been seen yet."""
        measured = self._prefill_rate is not None or bool(self._decode_s)
        rate = self._prefill_rate or DEFAULT_SPEED.prefill_tokens_per_s
        base, per_seq = _fit(self._decode_s)
        mixed = self._mixed_rate
        if mixed is None and self._prefill_rate is None:
            mixed = DEFAULT_SPEED.mixed_tokens_per_s  # the default's own, not a share of it
        return MachineSpeed(rate, base, per_seq, measured, mixed)


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else old + EMA * (new - old)


def _fit(times: dict[int, float]) -> tuple[float, float]:
    """(base, per sequence) through the measured step times by batch size: least squares over
    two or more sizes; from one size, split in the default's proportion."""
    if not times:
        return DEFAULT_SPEED.decode_base_s, DEFAULT_SPEED.decode_per_seq_s
    if len(times) == 1:
        ((batch, t),) = times.items()
        default = DEFAULT_SPEED.decode_step_s(batch)
        scale = t / default
        return DEFAULT_SPEED.decode_base_s * scale, DEFAULT_SPEED.decode_per_seq_s * scale
    n = len(times)
    mean_b = sum(times) / n
    mean_t = sum(times.values()) / n
    var = sum((b - mean_b) ** 2 for b in times)
    per_seq = sum((b - mean_b) * (t - mean_t) for b, t in times.items()) / var
    per_seq = max(per_seq, 0.0)  # noise can tilt it; a bigger batch never runs faster
    base = max(mean_t - per_seq * mean_b, 0.0)
    return base, per_seq
