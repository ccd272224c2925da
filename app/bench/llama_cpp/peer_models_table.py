"""The `--peer llama.cpp --models` report as a table: the best round per engine, the ratios, the
roofline shares, the markdown the README carries and the PNG beside it.

Kept apart from the run (peer_models) so a canned report renders without running anything, and
so the README's table is one function of the JSON: regenerating it needs no rerun.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

OURS, PEER = "kvscope", "llama.cpp"
DASH = "—"
COLUMNS = (
    "model",
    "threads",
    "decode tok/s KVScope / llama.cpp",
    "ratio",
    "prefill tok/s KVScope / llama.cpp",
    "ratio",
    "TTFT s KVScope / llama.cpp",
    "roofline share KVScope / llama.cpp",
    "bandwidth GB/s",
)


def best_of(rounds: list[dict]) -> dict:
    """Each figure at its best over the rounds: a slower round measured a neighbour, not us."""
    return {
        "decode_tokens_per_s": max(r["decode_tokens_per_s"] for r in rounds),
        "prefill_tokens_per_s": max(r["prefill_tokens_per_s"] for r in rounds),
        "ttft_s": min(r["ttft_s"] for r in rounds),
    }


def finish_row(row: dict, bandwidth: float) -> dict:
    """A measured row plus its best figures, ratios and roofline (bandwidth in bytes/s)."""
    roofline = bandwidth / row["weight_bytes_per_token"]
    row = row | {"bandwidth_gb_s": bandwidth / 1e9, "roofline_tokens_per_s": roofline}
    shares, engines = {}, [name for name in (OURS, PEER) if row.get(name)]
    for name in engines:
        best = best_of(row[name]["rounds"])
        row[name] = row[name] | {"best": best}
        shares[name] = best["decode_tokens_per_s"] / roofline
    row["roofline_share"] = shares
    if PEER in engines:
        ours, theirs = row[OURS]["best"], row[PEER]["best"]
        row["ratio"] = {
            kind: ours[f"{kind}_tokens_per_s"] / theirs[f"{kind}_tokens_per_s"]
            if theirs[f"{kind}_tokens_per_s"]
            else None
            for kind in ("decode", "prefill")
        }
    else:
        row["ratio"] = None
    return row


def _pair(row: dict, key: str, fmt: str) -> str:
    values = [(row.get(name) or {}).get("best", {}).get(key) for name in (OURS, PEER)]
    return " / ".join(DASH if v is None else format(v, fmt) for v in values)


def _ratio(row: dict, kind: str) -> str:
    value = (row.get("ratio") or {}).get(kind)
    return DASH if value is None else f"x{value:.2f}"


def _shares(row: dict) -> str:
    shares = row.get("roofline_share") or {}
    return " / ".join(
        DASH if shares.get(name) is None else f"{100 * shares[name]:.0f}%" for name in (OURS, PEER)
    )


def table_cells(row: dict) -> list[str]:
    """One row's cells, in COLUMNS order."""
    if row.get("skipped"):
        return [row["model"], DASH, f"skipped: {row['skipped']}"] + [""] * (len(COLUMNS) - 3)
    return [
        row["model"],
        str(row["threads"]),
        _pair(row, "decode_tokens_per_s", ".1f"),
        _ratio(row, "decode"),
        _pair(row, "prefill_tokens_per_s", ".1f"),
        _ratio(row, "prefill"),
        _pair(row, "ttft_s", ".3f"),
        _shares(row),
        f"{row['bandwidth_gb_s']:.1f}",
    ]


def caption(report: dict) -> str:
    cpu, s, peer = report["cpu"], report["settings"], report["peer"]
    isa = ", ".join(flag for flag, on in cpu["isa"].items() if on) or "none of the listed"
    who = f"llama-cpp-python {peer['version']}" if peer["version"] else peer["missing"]
    return (
        f"{cpu['model_name']} ({cpu['physical_cores']} physical cores; {isa}); batch-1 greedy "
        f"decode of {s['decode_tokens']} tokens, prefill of a {s['prompt_tokens']}-token prompt "
        f"(tok/s = prompt / TTFT), best of {s['rounds']} alternating rounds; peer: {who}. "
        "Roofline share: decode tok/s over (bandwidth at that thread count / the GGUF's bytes "
        "per decode token)."
    )


def markdown_table(report: dict) -> str:
    """The caption and a GitHub markdown table, one line per (model, threads)."""
    lines = [
        caption(report),
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" if i < 2 else "---:" for i in range(len(COLUMNS))) + "|",
    ]
    lines += ["| " + " | ".join(table_cells(row)) + " |" for row in report["rows"]]
    # A peer that was installed but could not run a model: said under the table, once per model.
    failures = {r["model"]: r["peer_failed"] for r in report["rows"] if r.get("peer_failed")}
    lines += [""] * bool(failures) + [f"{m}: {why}" for m, why in failures.items()]
    return "\n".join(lines)


def plot_peer_models(report: dict, path: Path) -> None:
    """Decode and prefill bars per row (roofline marked on decode) and the ratios against 1.0."""
    rows = [r for r in report["rows"] if not r.get("skipped")]
    fig = Figure(figsize=(max(8, 1.3 * len(rows) + 3), 10), layout="constrained")
    decode, prefill, ratio = fig.subplots(3, 1, sharex=True)
    x = list(range(len(rows)))
    labels = [f"{r['model']}\n{r['threads']} thr" for r in rows]
    for ax, key, title in (
        (decode, "decode_tokens_per_s", "batch-1 decode"),
        (prefill, "prefill_tokens_per_s", f"prefill, {report['settings']['prompt_tokens']} tokens"),
    ):
        for offset, name, color in ((-0.2, OURS, "#2a7ab9"), (0.2, PEER, "#d9822b")):
            values = [(r.get(name) or {}).get("best", {}).get(key, 0.0) for r in rows]
            bars = ax.bar([i + offset for i in x], values, 0.4, color=color, label=name)
            ax.bar_label(bars, labels=[f"{v:.1f}" if v else "" for v in values], fontsize=7)
        ax.set_ylabel("tokens / s")
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.15)
    decode.scatter(
        x, [r["roofline_tokens_per_s"] for r in rows], marker="_", s=400, color="k", zorder=3
    )
    decode.plot([], [], "k_", markersize=12, label="bandwidth roofline")
    decode.legend(fontsize=8)
    prefill.legend(fontsize=8)
    plotted = False
    for kind, marker in (("decode", "o"), ("prefill", "s")):
        values = [(r.get("ratio") or {}).get(kind) for r in rows]
        shown = [(i, v) for i, v in zip(x, values, strict=True) if v is not None]
        if shown:
            ratio.plot(*zip(*shown, strict=True), marker, label=f"{kind} KVScope / llama.cpp")
            plotted = True
    ratio.axhline(1.0, color="k", linewidth=1)
    ratio.set_ylabel("ratio")
    ratio.set_title("KVScope / llama.cpp (above 1: KVScope faster)")
    ratio.grid(axis="y", alpha=0.3)
    if plotted:
        ratio.legend(fontsize=8)
    else:
        why = "did not run" if report["peer"]["version"] else "is not installed"
        ratio.text(0.5, 0.5, f"llama.cpp {why}", transform=ratio.transAxes, ha="center")
    ratio.set_xticks(x, labels, fontsize=8)
    fig.suptitle(report["cpu"]["model_name"])
    fig.savefig(path, dpi=100)
