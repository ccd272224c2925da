"""`kvscope bench --gpu`: paged-attention decode on a CUDA GPU, kernel by kernel and end to end.

Writes <out>/bench_gpu.json with the on-device correctness checks and two grids:
  kernel  our Triton paged decode against torch SDPA over contiguous K/V, batch 1..64 x context
          512..8192 on one Llama-3-8B-shaped layer (32 query / 8 KV heads, head dim 128), fp8 KV
          as well where the GPU has it (compute capability >= 8.9); see `gpu_kernels`.
  engine  decode tokens/s of the engine on the bundled model (16-bit KV, and fp8 KV where
          supported) against the engine's model on one contiguous cache per layer with SDPA,
          over batch 1..64 x context 512..8192; see `gpu_engine`.
How calls are timed and where the peak bandwidth comes from: `gpu_device`.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from kvscope.app.bench.gpu.device import half_dtype, peak_bandwidth
from kvscope.app.bench.gpu.engine_decode import engine_grid
from kvscope.app.bench.gpu.kernel_timing import kernel_checks, kernel_grid
from kvscope.app.bench.gpu.settings import GpuBenchSettings
from kvscope.engine.model.loader import LoadedModel, load_model


def gpu_unavailable_reason() -> str | None:
    """Why `--gpu` cannot run here (None when it can)."""
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return (
            f"kvscope bench --gpu needs an NVIDIA GPU, and torch {torch.__version__} ({build}) "
            "sees none. `kvscope bench` without --gpu runs the CPU benchmark."
        )
    if importlib.util.find_spec("triton") is None:
        return "kvscope bench --gpu needs the triton package: `pip install triton`."
    return None


def gpu_benchmark(settings: GpuBenchSettings, loaded: LoadedModel | None = None) -> dict:
    started = time.perf_counter()
    device = torch.device("cuda")
    checks = kernel_checks(device, [torch.float32, half_dtype(device)])
    peak = peak_bandwidth(device)
    kernel = kernel_grid(settings, device, peak["peak_gb_s"])
    loaded = loaded or load_model(None)
    engine = engine_grid(settings, loaded, device)
    props = torch.cuda.get_device_properties(device)
    report = {
        "device": peak
        | {
            "capability": list(torch.cuda.get_device_capability(device)),
            "sms": props.multi_processor_count,
            "memory_bytes": props.total_memory,
            "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda,
            "triton_version": importlib.import_module("triton").__version__,
        },
        "model": {"name": Path(loaded.source).name, "dtype": str(half_dtype(device))},
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(settings).items()},
        "checks": checks,
        "kernel": kernel,
        "engine": engine,
        "runtime_s": time.perf_counter() - started,
    }
    settings.out.mkdir(parents=True, exist_ok=True)
    (settings.out / "bench_gpu.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def summarize_gpu(report: dict) -> str:
    dev = report["device"]
    lines = [
        f"KVScope GPU bench: {dev['device_name']}, peak {dev['peak_gb_s']:.0f} GB/s "
        f"({dev['peak_source']}; copy measured {dev['copy_gb_s']:.0f} GB/s)",
    ]
    for c in report["checks"]:
        verdict = "ok" if c["ok"] else "FAILED"
        diffs = ", ".join(f"{k} {v:.1e}" for k, v in c["max_abs_diff"].items())
        lines.append(
            f"  check {verdict}: Triton vs torch, heads {c['heads']}, {c['dtype']} q, "
            f"{c['kv_dtype']} KV: store bit-exact {c['store_bit_exact']}; max |diff| {diffs}"
        )
    lines.append(
        "  decode kernel (us, % of peak bandwidth): batch x context, ours vs SDPA contiguous"
    )
    for p in report["kernel"]:
        sdpa = ""
        if "sdpa_us" in p:
            sdpa = f"  sdpa {p['sdpa_us']:8.1f} ({p['sdpa_pct_of_peak']:3.0f}%)"
        lines.append(
            f"    {p['kv_dtype']:>13} {p['batch']:3d} x {p['context']:5d}: "
            f"ours {p['ours_us']:8.1f} ({p['ours_pct_of_peak']:3.0f}%, "
            f"splits {p['num_splits']}){sdpa}"
        )
    lines.append("  engine decode tokens/s: batch x prompt tokens")
    for name, points in report["engine"].items():
        cells = ", ".join(
            f"{p['batch']}x{p['prompt_tokens']} "
            + (f"{p['tokens_per_s']:.0f}" if "tokens_per_s" in p else p["error"])
            for p in points
        )
        lines.append(f"    {name}: {cells}")
    lines.append(f"  runtime {report['runtime_s']:.0f} s")
    return "\n".join(lines)


def run_gpu_bench(args) -> int:
    """CLI entry for `kvscope bench --gpu`: a clear message and rc 2 where there is no GPU."""
    reason = gpu_unavailable_reason()
    if reason is not None:
        print(reason, file=sys.stderr)
        return 2
    settings = GpuBenchSettings(out=Path(args.out))
    report = gpu_benchmark(settings)
    print(summarize_gpu(report))
    print(f"  wrote {settings.out / 'bench_gpu.json'}")
    return 0 if all(c["ok"] for c in report["checks"]) else 1
