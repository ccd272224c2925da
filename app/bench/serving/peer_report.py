"""The serve-vs-llama-server report as people read it: a markdown table (printed, for the README)
and a PNG, both from bench_serve_peer.json alone so they can be redrawn from a saved run
(`python -m kvscope.app.bench.serving.peer_report bench_out/bench_serve_peer.json`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from matplotlib.figure import Figure

COLUMNS = (
    "clients",
    "server",
    "requests/s",
    "output tok/s",
    "vs llama-server",
    "TTFT p50",
    "TTFT p99",
    "ITL p50",
    "ITL p99",
    "completed",
    "lost",
    "warm round",
)


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.0f} ms"


def _warm(warm: dict | None) -> str:
    if not warm:
        return "none"
    return f"{warm['completed']}/{warm['requests']} in {warm['seconds']:.1f} s"


def _cell(report: dict, server: str, clients: int) -> dict | None:
    for cell in report["cells"]:
        if cell["server"] == server and cell["clients"] == clients:
            return cell
    return None


def _ratio(report: dict, cell: dict) -> str:
    if cell["server"] != "kvscope":
        return ""
    peer = _cell(report, "llama.cpp", cell["clients"])
    if not peer or not peer["output_tokens_per_s"]:
        return "n/a"
    return f"x{cell['output_tokens_per_s'] / peer['output_tokens_per_s']:.2f}"


def _header(report: dict) -> str:
    m, peer = report["machine"], report["llama_server"]
    prompts = sorted(
        {round(c["mean_prompt_tokens"]) for c in report["cells"] if c["mean_prompt_tokens"]}
    )
    counted = sorted(
        {
            f"{c['server']}: {c['output_tokens_counted_from']}"
            for c in report["cells"]
            if c["output_tokens_counted_from"]
        }
    )
    return (
        f"Serving: `kvscope serve` vs llama.cpp's `llama-server` ({peer['version']}), "
        f"{Path(report['model']).name}, {report['threads']} threads each, on "
        f"{m.get('cpu_model', '?')} ({m['cpu_count']} logical CPUs). Streaming chat, a shared "
        f"system prompt ({'/'.join(map(str, prompts)) or '?'} prompt tokens per request), "
        f"{report['max_tokens']} output tokens per reply (ignore_eos), one server at a time, "
        f"order {', '.join(report['order'])}; each cell after one warm-up request and an "
        "uncounted warm round of as many requests as it has clients (so that every llama-server "
        "slot holds the shared prompt: its cache is per slot), then bounded by "
        f"{report['seconds_per_cell']:.0f} s and a request count. llama-server: -np "
        f"{peer['slots']}, continuous batching, {peer['ctx_note']}. Output tokens counted from "
        f"({'; '.join(counted)})."
    )


def markdown_table(report: dict) -> str:
    rows = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---:" if c not in ("server",) else "---" for c in COLUMNS) + "|",
    ]
    for n in report["clients"]:
        for server in ("kvscope", "llama.cpp"):
            cell = _cell(report, server, n)
            if cell is None:
                continue
            name = "KVScope" if server == "kvscope" else "llama-server"
            values = [
                str(n),
                name,
                f"{cell['requests_per_s']:.2f}",
                f"{cell['output_tokens_per_s']:.1f}",
                _ratio(report, cell),
                _ms(cell["ttft_p50_s"]),
                _ms(cell["ttft_p99_s"]),
                _ms(cell["itl_p50_s"]),
                _ms(cell["itl_p99_s"]),
                f"{cell['requests_completed']}/{cell['requests_sent']}",
                str(cell["requests_lost"]),
                _warm(cell.get("warm_round")),
            ]
            rows.append("| " + " | ".join(values) + " |")
    return _header(report) + "\n\n" + "\n".join(rows)


def plot_serve_peer(report: dict, path: Path) -> None:
    fig = Figure(figsize=(13, 4), layout="constrained")
    axes = fig.subplots(1, 3)
    panels = (
        ("output tokens/s", "output_tokens_per_s", None, 1.0),
        ("TTFT (ms), p50 solid, p99 dashed", "ttft_p50_s", "ttft_p99_s", 1000.0),
        ("inter-token latency (ms), p50 / p99", "itl_p50_s", "itl_p99_s", 1000.0),
    )
    for ax, (title, key, key99, scale) in zip(axes, panels, strict=True):
        for server, colour in (("kvscope", "tab:blue"), ("llama.cpp", "tab:orange")):
            cells = sorted(
                (c for c in report["cells"] if c["server"] == server), key=lambda c: c["clients"]
            )
            xs = [c["clients"] for c in cells]
            label = "KVScope" if server == "kvscope" else "llama-server"

            def ys(k: str, cells=cells, scale=scale) -> list[float]:
                return [float("nan") if c[k] is None else c[k] * scale for c in cells]

            ax.plot(xs, ys(key), "o-", color=colour, label=label)
            if key99:
                ax.plot(xs, ys(key99), "o--", color=colour, alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_xticks(report["clients"], [str(n) for n in report["clients"]])
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(
        f"{Path(report['model']).name}, {report['threads']} threads, "
        f"{report['machine'].get('cpu_model', '')}"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m kvscope.app.bench.serving.peer_report bench_serve_peer.json")
        return 2
    report = json.loads(Path(args[0]).read_text())
    print(markdown_table(report))
    plot_serve_peer(report, Path(args[0]).with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
