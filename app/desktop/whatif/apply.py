"""What "Apply these settings" hands the real engine: the app's settings with the knobs this
what-if changed, or the reasons it cannot.

Only the knobs the what-if changed move (the rest stay as the window has them now, which after
a rebuild may differ from what the trace was recorded under). The pool becomes `kv_budget_mib`,
the app's CPU pool setting, in whole MiB (the tooltip says when that holds another number of
blocks than the what-if's pool); on CUDA the pool is sized from the GPU's memory
share instead, so a pool what-if cannot be applied there. The result is checked as the engine
would check it (`EngineSettings.engine_config`): a knob the engine refuses disables Apply with
the engine's own words. The arrival rate and the sliding-window release are no engine settings
of the app: Apply says it leaves them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypedDict

from kvscope.app.core.settings import AppSettings
from kvscope.engine.trace import TraceSettings
from kvscope.engine.whatif import SimConfig, WhatIf, resolve

MIB = 1 << 20
NOT_ENGINE = {
    "rate_scale": "the arrival rate is the traffic's, not the engine's",
    "honour_windows": "releasing sliding-window blocks is always on in the app's engine",
}


class EngineChanges(TypedDict, total=False):
    """The EngineSettings fields a what-if may move, with their new values."""

    kv_budget_mib: int
    block_size: int
    kv_cache_dtype: str
    max_num_seqs: int
    max_model_len: int
    enable_prefix_caching: bool
    allocator: str


@dataclass(frozen=True)
class ApplyPlan:
    settings: AppSettings | None  # None: nothing to apply, or it cannot be (see problems)
    changes: tuple[str, ...]  # "block_size 16 → 32", one per engine field that moves
    problems: tuple[str, ...]  # why Apply is off
    left_out: tuple[str, ...]  # what-if knobs that are no engine settings
    notes: tuple[str, ...] = ()  # e.g. the whole MiB holding another number of blocks

    @property
    def can_apply(self) -> bool:
        return self.settings is not None and not self.problems and bool(self.changes)

    def tooltip(self) -> str:
        if self.problems:
            return "Cannot apply: " + "; ".join(self.problems)
        if not self.changes:
            return "These are the engine's settings already"
        notes = "".join(f" ({note})" for note in self.notes)
        return "Rebuild the engine with " + ", ".join(self.changes) + notes


def plan_apply(
    what: WhatIf, config: SimConfig, recorded: TraceSettings, current: AppSettings
) -> ApplyPlan:
    """The settings Apply would adopt for `what` (resolved as `config`)."""
    engine = current.engine
    fields: EngineChanges = {}
    problems: list[str] = []
    notes: list[str] = []
    # The pool asked for, not the blocks it came to (a 16 MiB pool of 32-token blocks holds
    # 15.x MiB of them: the engine sizes a 16 MiB budget the same way).
    asked = what.kv_pool if what.num_blocks is None else config.pool_bytes
    if asked is not None:  # the pool was changed, as bytes or as blocks
        if recorded.device.startswith("cuda"):
            problems.append(
                "on CUDA the pool is sized from the GPU memory share (Settings), not in MiB"
            )
        elif asked < MIB:
            problems.append(
                f"a pool of {asked:,} bytes is under 1 MiB, the least the app's KV budget "
                "setting takes"
            )
        else:
            fields["kv_budget_mib"] = mib = round(asked / MIB)
            try:
                budget = resolve(
                    recorded, dataclasses.replace(what, kv_pool=mib * MIB, num_blocks=None)
                )
            except ValueError as e:  # whole MiB may hold no block of a large model
                problems.append(str(e))
            else:
                if budget.num_blocks != config.num_blocks:
                    notes.append(
                        f"{mib} MiB holds {budget.num_blocks:,} blocks, the what-if's pool "
                        f"{config.num_blocks:,}"
                    )
    if what.block_size is not None:
        fields["block_size"] = what.block_size
    if what.kv_dtype != "auto":
        fields["kv_cache_dtype"] = what.kv_dtype
    if what.max_num_seqs is not None:
        fields["max_num_seqs"] = what.max_num_seqs
    if what.max_model_len is not None:
        fields["max_model_len"] = what.max_model_len
    if what.prefix_caching is not None:
        fields["enable_prefix_caching"] = what.prefix_caching
    if what.allocator is not None:
        fields["allocator"] = what.allocator
    left_out = tuple(
        f"{name}: {why}"
        for name, why in NOT_ENGINE.items()
        if getattr(what, name) not in (None, 1.0)
    )
    changes = tuple(
        f"{name} {getattr(engine, name)} → {value}"
        for name, value in fields.items()
        if getattr(engine, name) != value
    )
    new_engine = dataclasses.replace(engine, **fields)
    try:
        new_engine.engine_config()  # what the engine itself would refuse
    except ValueError as e:
        problems.append(str(e))
    settings = dataclasses.replace(current, engine=new_engine)
    return ApplyPlan(settings, changes, tuple(problems), left_out, tuple(notes))
