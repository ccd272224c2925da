"""bench.png: useful tokens/s of each contender, and batch-1 decode against the roofline."""

from __future__ import annotations

from pathlib import Path

# The object-oriented API renders with Agg without touching pyplot's global backend, so it is
# safe inside the Qt app's process too.
from matplotlib.figure import Figure

_OURS, _HF, _LIMIT = "#2a7ab9", "#d9822b", "#9a9a9a"


def _bars(ax, labels: list[str], values: list[float], colors: list[str], title: str) -> None:
    bars = ax.bar(labels, values, color=colors)
    ax.bar_label(bars, labels=[f"{v:.1f}" for v in values], padding=2)
    ax.set_title(title)
    ax.set_ylabel("tokens / s")
    ax.margins(y=0.15)
    ax.grid(axis="y", alpha=0.3)


def plot_bench(report: dict, path: Path) -> None:
    """Two panels from a bench report; HF bars are left out when the report skipped HF."""
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    throughput, decode = fig.subplots(1, 2)

    ours, hf_static, hf_seq = report["ours"], report["hf_static"], report["hf_sequential"]
    quantized = report.get("ours_quantized")
    labels, values, colors = (
        ["KVScope float32\n(continuous batching)"],
        [ours["useful_tokens_per_s"]],
        [_OURS],
    )
    if quantized is not None:
        labels.append(f"KVScope auto\n({quantized['dtype']}, {quantized['weight_format']})")
        values.append(quantized["useful_tokens_per_s"])
        colors.append(_OURS)
    if hf_static is not None:
        labels.append(f"HF generate\n(static batch {hf_static['batch_size']})")
        values.append(hf_static["useful_tokens_per_s"])
        colors.append(_HF)
    if hf_seq is not None:
        labels.append(f"HF generate\n(one at a time, {hf_seq['num_requests']} req)")
        values.append(hf_seq["useful_tokens_per_s"])
        colors.append(_HF)
    title = f"Useful tokens/s, {report['workload']['num_requests']} chat requests"
    target = report["targets"]["useful_throughput_vs_hf_static"]
    if target["ratio"] is not None:
        title += f"\nfloat32 {target['ratio']:.2f}x HF static (target {target['target']:g}x)"
    q_target = report["targets"].get("useful_throughput_quantized_vs_hf_static")
    if q_target and q_target["ratio"] is not None:
        title += f", auto {q_target['ratio']:.2f}x (target {q_target['target']:g}x)"
    _bars(throughput, labels, values, colors, title)

    d = report["decode_batch1"]
    labels = ["roofline float32\n(bandwidth / bytes)", "KVScope\nfloat32"]
    values = [d["roofline"]["tokens_per_s"], d["ours_tokens_per_s"]]
    colors = [_LIMIT, _OURS]
    if "ours_quantized_tokens_per_s" in d:
        labels += ["roofline auto", "KVScope\nauto"]
        values += [d["quantized_roofline"]["tokens_per_s"], d["ours_quantized_tokens_per_s"]]
        colors += [_LIMIT, _OURS]
    if d["hf_tokens_per_s"] is not None:
        labels.append("HF generate")
        values.append(d["hf_tokens_per_s"])
        colors.append(_HF)
    target = report["targets"]["decode_batch1_vs_roofline"]
    share = f"{d['ours_pct_of_roofline']:.0f}% of roofline (target {target['target']:.0%})"
    title = f"Batch-1 decode\n{share}"
    _bars(decode, labels, values, colors, title)
    fig.suptitle(f"KVScope bench: {report['model']['name']}, CPU")
    fig.savefig(path, dpi=110)
