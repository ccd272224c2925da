"""`kvscope bench --models`: what loading a model the size people run costs, kept quantized or not.

For each synthetic GGUF (`engine.bench.synthetic_gguf`) and each quantization mode, a fresh
process loads it on the CPU, with its tokenizer already converted and cached as after a first
load, and decodes at batch 1 and 16 (`model_probe`). Reported per run:
file size, load time, peak RSS, RSS after load, decode tokens/s; beside them the planner's
prediction for the same load (`engine.bench.load_plan`) and the issue's target, peak RSS <= 1.3 x
the file + the KV pool + 600 MB. JSON + PNG.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from matplotlib.figure import Figure

from kvscope.engine.bench.load_plan import planned_cpu_load
from kvscope.engine.bench.synthetic_gguf import SHAPES, ensure_synthetic_gguf
from kvscope.engine.child_python import python_module_command
from kvscope.engine.model.loader import load_model

KV_BYTES = 256 << 20
TARGET_FACTOR, TARGET_SLACK = 1.3, 600 * 10**6
QUANTIZATIONS = ("auto", "none")
GIB = 2**30


def probe(path: Path, quantization: str, timeout_s: float) -> dict:
    cmd = python_module_command(
        "kvscope.app.bench.models.probe", str(path), quantization, str(KV_BYTES)
    )
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_models_bench(
    out: Path,
    cache_dir: Path,
    shapes=("1.1B", "1.1B-Q4_0", "3B"),
    quantizations=QUANTIZATIONS,
    timeout_s=1800,
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in shapes:
        shape = SHAPES[shape] if isinstance(shape, str) else shape
        name = shape.name
        path = ensure_synthetic_gguf(shape, cache_dir)
        file_bytes = path.stat().st_size
        # The first load of a GGUF converts its tokenizer once and caches it; measure the loads
        # a user makes every day after that, not the one-off conversion.
        load_model(path)
        for quantization in quantizations:
            result = probe(path, quantization, timeout_s)
            target = TARGET_FACTOR * file_bytes + KV_BYTES + TARGET_SLACK
            row = {
                "model": name,
                "file": str(path),
                "file_bytes": file_bytes,
                "quantization": quantization,
                "planned": planned_cpu_load(path, quantization, KV_BYTES),
                "target_peak_rss": int(target),
                **result,
            }
            if "peak_rss" in result:
                row["meets_target"] = result["peak_rss"] <= target
            rows.append(row)
            print(_line(row), flush=True)
    report = {"kv_bytes": KV_BYTES, "runs": rows}
    (out / "bench_models.json").write_text(json.dumps(report, indent=2))
    plot_models(report, out / "bench_models.png")
    return report


def _line(row: dict) -> str:
    head = f"{row['model']:>9} {row['quantization']:<5} file {row['file_bytes'] / GIB:.2f} GiB"
    if "error" in row:
        return f"{head}: {row['error']}"
    d = row["decode"]
    return (
        f"{head}: load {row['load_s']:.1f} s, peak RSS {row['peak_rss'] / GIB:.2f} GiB "
        f"(target {row['target_peak_rss'] / GIB:.2f}, planned {row['planned']['total'] / GIB:.2f})"
        f", after load {row['rss_after_load'] / GIB:.2f}, weights {row['weight_bytes'] / GIB:.2f} "
        f"GiB {row['weight_format']} ({row['weight_layout']}, {row['dtype']}), decode "
        f"{d['1']['tokens_per_s']:.2f} tok/s at 1, {d['16']['tokens_per_s']:.2f} at 16"
    )


def plot_models(report: dict, path: Path) -> None:
    runs = [r for r in report["runs"] if "peak_rss" in r]
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    mem, speed = fig.subplots(1, 2)
    labels = [f"{r['model']}\n{r['quantization']}" for r in runs]
    x = range(len(runs))
    mem.bar([i - 0.3 for i in x], [r["file_bytes"] / GIB for r in runs], 0.2, label="file")
    mem.bar([i - 0.1 for i in x], [r["peak_rss"] / GIB for r in runs], 0.2, label="peak RSS")
    mem.bar([i + 0.1 for i in x], [r["planned"]["total"] / GIB for r in runs], 0.2, label="planned")
    mem.bar([i + 0.3 for i in x], [r["target_peak_rss"] / GIB for r in runs], 0.2, label="target")
    mem.set_xticks(list(x), labels)
    mem.set_ylabel("GiB")
    mem.set_title("Load: peak host memory")
    mem.legend()
    for batch, offset in (("1", -0.2), ("16", 0.2)):
        speed.bar(
            [i + offset for i in x],
            [r["decode"][batch]["tokens_per_s"] for r in runs],
            0.4,
            label=f"batch {batch}",
        )
    speed.set_xticks(list(x), labels)
    speed.set_ylabel("tokens / s")
    speed.set_title("CPU decode")
    speed.legend()
    fig.savefig(path, dpi=110)
