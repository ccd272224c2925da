"""`kvscope bench --sliding`: KV held versus tokens for one long generation, windows honoured and
ignored (engine.bench.sliding_window), as bench_sliding.json and bench_sliding.png.

Blocks of different layouts differ in size (a Gemma 3 block holds one KV group's layers, with
windows ignored all of them), so the plot compares bytes; the JSON keeps blocks too."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from kvscope.engine.bench.sliding_window import run_sliding_bench

MIB = 2**20
_COLORS = {"mistral": "#2a7ab9", "gemma3": "#3a9a5b"}


def plot_sliding(report: dict, path: Path) -> None:
    fig = Figure(figsize=(10, 4.5), layout="constrained")
    ax_bytes, ax_blocks = fig.subplots(1, 2)
    for run in report["runs"]:
        color = _COLORS.get(run["model"], "#555555")
        honoured = run["windows_honoured"]
        mode = "windows honoured" if honoured else "windows ignored"
        mib = [b * run["bytes_per_block"] / MIB for b in run["blocks_held"]]
        style = "-" if honoured else ":"
        ax_bytes.plot(run["tokens"], mib, style, color=color, label=f"{run['model']}, {mode}")
        if not honoured:
            ax_blocks.plot(
                run["tokens"], run["blocks_held"], ":", color=color, label=f"{run['model']}, {mode}"
            )
            continue
        # Honoured: the sliding groups' blocks (flat at the window) apart from the full ones.
        windows = run["group_windows"]
        for kind, style, wanted in (("sliding groups", "-", True), ("full groups", "-.", False)):
            picked = [g for g, w in enumerate(windows) if (w is not None) == wanted]
            if not picked:
                continue
            counts = [sum(row[g] for g in picked) for row in run["blocks_held_by_group"]]
            ax_blocks.plot(
                run["tokens"], counts, style, color=color, label=f"{run['model']}, {kind}"
            )
    ax_bytes.set_title("KV memory held during one generation")
    ax_bytes.set_ylabel("MiB held")
    ax_blocks.set_title(f"KV blocks held by kind of group ({report['block_size']} tokens/block)")
    ax_blocks.set_ylabel("blocks held (a block: one KV group's layers)")
    ax_blocks.set_yscale("symlog", linthresh=10)
    for ax in (ax_bytes, ax_blocks):
        ax.set_xlabel("tokens in the sequence")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"Sliding window {report['window']} tokens: released pages keep the footprint flat"
    )
    fig.savefig(path, dpi=110)


def summarize_sliding(report: dict) -> str:
    lines = [
        f"sliding-window bench: {report['num_tokens']:,} tokens after a "
        f"{report['prompt_len']}-token prompt, window {report['window']}, blocks of "
        f"{report['block_size']}"
    ]
    for run in report["runs"]:
        mode = "honoured" if run["windows_honoured"] else "ignored "
        same = run.get("same_tokens_as_ignored")
        lines.append(
            f"  {run['model']:<8} windows {mode}: peak {run['peak_blocks']:,} blocks = "
            f"{run['peak_bytes'] / MIB:.2f} MiB, {run['blocks_released']:,} released, "
            f"{run['seconds']:.1f} s" + ("" if same is None else f", same tokens: {same}")
        )
    for name, why in report["skipped"].items():
        lines.append(f"  {name}: skipped ({why})")
    return "\n".join(lines)


def run_and_plot(out: Path, workdir: Path, num_tokens: int) -> dict:
    report = run_sliding_bench(out, workdir, num_tokens=num_tokens)
    plot_sliding(report, out / "bench_sliding.png")
    return report
