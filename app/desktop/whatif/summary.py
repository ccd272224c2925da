"""The What-if tab's words: each side's settings, the recorded-vs-what-if figures, where the
what-if leaves the recording, and what a trace that is not complete means for its replay.

Times of the what-if are modelled (the cost model fitted to the recording's steps, whose error
the tab states); the recorded column's are measured. Rich text, in the theme on show.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from kvscope.app.desktop.blockmap import colors
from kvscope.app.desktop.palette import current
from kvscope.engine.trace import Trace
from kvscope.engine.whatif import SimConfig, SimResult, SimSummary, WhatIf

MIB = 1 << 20


def seconds(value: float) -> str:
    if value < 1.0:
        return f"{value * 1e3:,.0f} ms"
    return f"{value:,.2f} s" if value < 100 else f"{value:,.0f} s"


def size_text(pool: int) -> str:
    if pool >= 1 << 30:
        return f"{pool / (1 << 30):,.2f} GiB"
    return f"{pool / MIB:,.1f} MiB" if pool >= MIB else f"{pool / 1024:,.0f} KiB"


def pool_text(config: SimConfig) -> str:
    size = size_text(config.pool_bytes)
    return f"{config.num_blocks:,} blocks × {config.block_size} ({size}, {config.kv_dtype})"


def what_text(what: WhatIf) -> str:
    """The knobs a what-if changed, in words ("as recorded" when none)."""
    parts = []
    if what.kv_pool is not None:
        parts.append(f"pool {size_text(what.kv_pool)}")
    if what.num_blocks is not None:
        parts.append(f"{what.num_blocks:,} blocks")
    if what.block_size is not None:
        parts.append(f"blocks of {what.block_size}")
    if what.kv_dtype != "auto":
        parts.append(f"{what.kv_dtype} KV")
    if what.max_num_seqs is not None:
        parts.append(f"≤ {what.max_num_seqs} seqs")
    if what.max_model_len is not None:
        parts.append(f"max len {what.max_model_len:,}")
    if what.max_batched_tokens is not None:
        parts.append(f"{what.max_batched_tokens:,} tokens a step")
    if what.prefix_caching is not None:
        parts.append("prefix cache " + ("on" if what.prefix_caching else "off"))
    if what.allocator is not None:
        parts.append(what.allocator)
    if what.honour_windows is not None:
        parts.append("windows " + ("released" if what.honour_windows else "kept"))
    if what.rate_scale != 1.0:
        parts.append(f"arrivals ×{what.rate_scale:.2f}")
    return ", ".join(parts) or "as recorded"


def settings_text(config: SimConfig) -> str:
    """One line of what a run ran under."""
    parts = [
        pool_text(config),
        f"≤ {config.max_num_seqs} seqs",
        f"max len {config.max_model_len:,}",
        f"prefix cache {'on' if config.enable_prefix_caching else 'off'}",
        config.allocator,
    ]
    if any(w is not None for w in config.layer_windows):
        parts.append("windows released" if config.release_window_blocks else "windows kept")
    if config.rate_scale != 1.0:
        parts.append(f"arrivals ×{config.rate_scale:.2f}")
    return " · ".join(parts)


def side_caption(recorded: bool, config: SimConfig | None, what: WhatIf | None = None) -> str:
    theme = colors.active()
    if recorded:
        head = f"<b style='color:{theme.paged_hex}'>Recorded</b>"
    else:
        changed = escape(what_text(what)) if what is not None else "as recorded"
        head = f"<b style='color:{theme.naive_hex}'>What if</b> {changed}"
    if config is None:
        return head
    return f"{head}<br><span style='color:{current().muted}'>{settings_text(config)}</span>"


def _count(v: float) -> str:
    return f"{v:,.0f}"


# label, summary field (or two), formatter: the rows of the figures table
ROWS = (
    ("Preemptions", ("preemptions",), _count),
    ("Peak concurrency (running)", ("peak_running",), _count),
    ("Peak blocks used", ("peak_blocks_used",), _count),
    ("Requests that waited", ("waited",), _count),
    ("Requests refused (prompt too long)", ("rejected",), _count),
    ("Mean wait", ("mean_wait_s",), seconds),
    ("p95 wait", ("p95_wait_s",), seconds),
    ("TTFT p50", ("p50_ttft_s",), seconds),
    ("TTFT p95", ("p95_ttft_s",), seconds),
    ("Makespan (to the last step)", ("makespan_s",), seconds),
    ("Prefix-cache hit tokens", ("prefix_hit_tokens",), _count),
    ("Steps", ("steps",), _count),
)


def _cell(summary: SimSummary | None, names: tuple[str, ...], fmt) -> str:
    if summary is None:
        return "—"
    return " · ".join(fmt(getattr(summary, n)) for n in names)


def _known(v: float | None) -> str:
    return "—" if v is None else _count(v)


# Under the hit tokens, where either run re-read any: hits that are no sharing at all.
RECOMPUTE_ROW = ("  of which re-reads after preemption", ("recompute_hit_tokens",), _known)


def figures_html(recorded: SimSummary, whatif: SimSummary | None) -> str:
    """The table of figures, recorded beside what-if; the what-if's cell is bold where it
    differs."""
    theme, p = colors.active(), current()
    pad = "padding-left: 14px"
    head = (
        f"<tr><th></th><th align='right' style='color:{theme.paged_hex}; {pad}'>Recorded</th>"
        f"<th align='right' style='color:{theme.naive_hex}; {pad}'>What if</th></tr>"
    )
    shown_rows = list(ROWS)
    if any(s is not None and s.recompute_hit_tokens for s in (recorded, whatif)):
        at = next(i for i, row in enumerate(ROWS) if row[1] == ("prefix_hit_tokens",))
        shown_rows.insert(at + 1, RECOMPUTE_ROW)
    rows = []
    for label, names, fmt in shown_rows:
        mine, theirs = _cell(recorded, names, fmt), _cell(whatif, names, fmt)
        shown = f"<b style='color:{p.strong}'>{theirs}</b>" if theirs != mine else theirs
        rows.append(
            f"<tr><td style='color:{p.muted}'>{label}</td>"
            f"<td align='right' style='{pad}'>{mine}</td>"
            f"<td align='right' style='{pad}'>{shown}</td></tr>"
        )
    return f"<table cellspacing='0' cellpadding='1'>{head}{''.join(rows)}</table>"


def divergence_line(result: SimResult) -> str:
    at = result.diverged_at
    if at is None:
        return "Identical to the recording: every step as it ran."
    step = result.steps[at - 1] if 0 < at <= len(result.steps) else None
    when = f" (t = {step.time:,.2f} s)" if step is not None else ""
    return f"Diverges from the recording at step {at:,}{when}; from there its times are modelled."


def headline(recorded: SimSummary, result: SimResult, caveat: str = "") -> str:
    """The what-if's headline figures against the recording's, where it diverges, and what
    its step times cannot know (engine.whatif.cost_caveat)."""
    s = result.summary
    parts = [
        f"{s.preemptions:,} preemptions (recorded {recorded.preemptions:,})",
        f"peak {s.peak_running} running ({recorded.peak_running})",
        f"{s.waited} waited ({recorded.waited})",
        f"p95 TTFT {seconds(s.p95_ttft_s)} ({seconds(recorded.p95_ttft_s)})",
    ]
    if s.rejected:
        parts.append(f"<b>{s.rejected} refused</b>")
    text = " · ".join(parts) + "<br>" + escape(divergence_line(result))
    for line in (hits_line(recorded, s), idle_line(result)):
        if line:
            text += "<br>" + escape(line)
    return text + (f"<br><i>{escape(caveat)}</i>" if caveat else "")


def hits_line(recorded: SimSummary, s: SimSummary) -> str:
    """Why the what-if's prefix hits exceed the recording's, where they do: re-reads after
    preemption, and first admissions that came after the shared prefix was computed; ""
    otherwise."""
    again = s.recompute_hit_tokens or 0
    parts = []
    if again:
        parts.append(
            f"{again:,} of the {s.prefix_hit_tokens:,} prefix-hit tokens are re-reads after "
            "preemption: a preempted sequence is prefilled again and finds its own blocks "
            "still cached"
        )
    if recorded.recompute_hit_tokens is not None:
        more = (s.prefix_hit_tokens - again) - (
            recorded.prefix_hit_tokens - recorded.recompute_hit_tokens
        )
        if more > 0:
            parts.append(
                f"{more:,} more are first admissions that came later than recorded, when the "
                "shared prefix had been computed (a request admitted in the step that computes "
                "it cannot share it)"
            )
    if not parts:
        return ""
    return "; ".join(parts) + ". More hits here is not more sharing."


def idle_line(result: SimResult) -> str:
    """What a step end with nothing running and requests waiting is: "" when there is none.
    The engine admits them in the very next step (nothing stalls), but the maps and plots
    show a step's end until the next step ends, so the moment shows for one step."""
    idle = [s for s in result.steps if s.running == 0 and s.waiting > 0]
    if not idle:
        return ""
    first = idle[0]
    many = len(idle) > 1
    return (
        f"{len(idle):,} step{'s' * many} (the first: step {first.step:,}, {first.waiting:,} "
        "waiting) ended with every running sequence finished and others "
        "waiting: the next step admits them at once, nothing stalls. The maps and plots hold "
        "a step's end until the next step ends, so such a moment shows 0 running for a step."
    )


def completeness_note(trace: Trace) -> str:
    """Why this trace's own replay is not the recorded run exactly; "" when it is."""
    if trace.complete:
        return ""
    reasons = []
    if trace.trimmed:
        reasons.append(
            "older traffic was dropped (the trace keeps the latest requests and steps), so "
            "the pool was not empty where it starts"
        )
    running = len(trace.requests) - len(trace.finishes)
    if running:
        reasons.append(
            f"{running} request{'s were' if running > 1 else ' was'} still running and "
            "left out (Refresh once they end)"
        )
    reasons.extend(trace.notes)  # e.g. a beam search, which the replay cannot repeat
    return "Not an exact replay: " + "; ".join(reasons) + "."


def self_replay_note(recorded: SimResult) -> str:
    """When replaying the trace under its own settings does not follow it to the end."""
    at = recorded.diverged_at
    if at is None:
        return ""
    step = recorded.steps[at - 1] if 0 < at <= len(recorded.steps) else None
    when = f" (t = {step.time:,.2f} s)" if step is not None else ""
    return (
        f"The replay of this trace under its own settings leaves the recording at step {at:,}"
        f"{when}: the recorded side is that replay, its figures from there on are modelled."
    )


def trace_line(trace: Trace) -> str:
    s = trace.settings
    done = len(trace.finished_requests)
    return (
        f"This engine's traffic: {done:,} finished request{'s' * (done != 1)}, "
        f"{len(trace.steps):,} steps · {Path(s.model).name} on {s.device}"
    )
